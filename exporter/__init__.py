"""Prometheus exporter and alerting sidecar for llama.cpp's llama-server.

Data flow: tail (logs/tail.py) → parse (logs/parse.py) → state (state.py) → collector
(collector.py) → web (web.py). Parse and state are pure: no I/O, no clock, no prometheus_client.
"""

__version__ = "0.1.0"
