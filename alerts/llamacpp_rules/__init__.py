"""The Prometheus rules for llamacpp-exporter, built by ``alerts/generate_rules.py``.

- ``config``: every setting (``Config``); ``text``: the annotations' template pieces;
  ``builder``: the selector, links and annotations every rule gets (``Rules``).
- ``recording``: the recording rules; one module per alert group: ``kv_pool``, ``memory``,
  ``server`` (llama-server and a router's children), ``exporter_health``, ``guard``.
- ``document``: the alerts' order and the YAML file; ``docs_table``: the docs' alert table;
  ``cli``: the command line.
"""
