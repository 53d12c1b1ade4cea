"""Prometheus exporter and alerting sidecar for llama.cpp's llama-server.

One folder per box of the data flow: `logs/` (tail, parse) → `model/` (state, pure: no I/O, no clock,
no prometheus_client) → `metrics/` (collectors) → `web/` (/metrics); `sources/` (NVML, /proc, HTTP) read
at scrape time; `guard/` in the request path; `diagnose/` over whole logs. The top level is the entry
point (`cli`) and the wiring (`flags`, `config`, `build`, `serve`). See docs/architecture.md.
"""

__version__ = "0.1.0"
