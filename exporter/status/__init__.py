"""The status page: `/` and `/api/status`, rendered from the same views a scrape renders. Pure."""
