"""The Prometheus rules for llamacpp-exporter, built by ``alerts/generate_rules.py``.

- ``config``: every setting (``Config``: the settings all rules share, and each alert module's ``Settings``);
  ``values``: what a duration or a link must be; ``text``: the annotations' template pieces;
  ``builder``: the selector, links and annotations every rule gets (``Rules``), and ``Alerts``, the list a
  module registers its alerts in.
- ``recording``: the recording rules; one module per alert group, each with its alerts' settings:
  ``kv_pages``, ``kv_pool``, ``latency``, ``memory``, ``server``, ``exporter_health``, ``router``, ``guard``.
- ``document``: the modules' order and the YAML file; ``docs_table``: the docs' alert table;
  ``cli``: the command line.
"""
