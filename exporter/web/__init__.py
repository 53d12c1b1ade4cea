"""The web side: the aiohttp server for `/metrics`, `/` and `/healthz` (`server`), TLS and basic auth from
`--web.config.file` (`webconfig`), and the container image's health check (`healthcheck`).
"""
