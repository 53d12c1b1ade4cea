"""The Grafana dashboard for llamacpp-exporter, built by ``dashboards/generate_dashboard.py``.

- ``query``: the datasource, the matchers every query carries, a Prometheus target (``q``);
  ``layout``: where panels go; ``panels``: the panel builders, colours and thresholds.
- One module per group of rows: ``glance`` (at a glance), ``kv_pool`` (the forecast and the pool),
  ``memory``, ``gpu`` (load, heat, power, clocks, Xid errors), ``requests`` (requests and their sizes),
  ``server`` (server, router, exporter health),
  ``guard`` (the guard's requests, queue, wait and admitted demand).
- ``dashboard``: the rows' order, variables, annotations and the JSON; ``cli``: the command line.
"""
