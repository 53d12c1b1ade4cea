"""The exposition: prometheus_client custom collectors, fresh metric families on every scrape.

One collector per area, like prometheus-pve-exporter, each docstring with sample output: `server_log`
(what the llama-server log says), `forecast`, `checkpoints`, `requests` (request sizes), `gpu`, `process`,
`server_http`, `live` (the live sources), `exporter_health` (the exporter's own). `servers` labels several
servers' (and a router's children's) series and merges them per family. `catalogue` holds every family's
name, type, help and labels; each collector builds its families from there. Each collector renders its
unit's view of the scrape (`exporter.model.view.ServerView`); nothing here builds a source or mutates state, and
nothing here imports anything but the model. Scrapes run on the same asyncio loop that applies log events,
so a scrape always sees a consistent state.
"""
