"""The model: what a llama-server's log and live sources say, applied to its state. Pure: no I/O, no clock.

`state.ServerState` is one server run's slots, pool and counters; `slot`, `bounds` and `provenance` are
what it checks before an event is applied; `forecast` is the demand and the time to full; `router` splits a
router's log into one state per child; `request_sizes` holds the request-size histograms;
`server_cmdline` reads llama-server's argv and environment; `clients` is what the guard calls a request's
client (the sources of its name and the form a name takes); `live` holds the live sources' snapshots and
`view` one server unit's view of one scrape.
"""
