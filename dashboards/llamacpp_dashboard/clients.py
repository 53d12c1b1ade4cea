"""Who holds the pool: the cells each client's requests hold, stacked against the pool the guard admits against
(exporter/guard/client_metrics.py exports them). Beside the slots' panel in the "KV pool" row: the slots say
how full the pool is, this panel whose requests fill it.

Like the guard's row, its series are one per exporter target (the guard fronts one llama-server), without
``server`` or ``model`` labels: filtered by job and instance only (``{G}``). Empty without the guard.
"""

from __future__ import annotations

from llamacpp_dashboard.panels import Panel, capacity_line, per_instance, timeseries
from llamacpp_dashboard.query import q


def who_holds_the_pool() -> Panel:
    return per_instance(
        timeseries(
            "Who holds the pool: cells by client",
            "llamacpp_guard_client_pool_tokens (stacked, one band per client: the KV cells its requests' slots "
            "hold now, as the guard matched requests to slots) against llamacpp_guard_pool_limit_tokens (red "
            "line: the pool the guard admits against). The widest band is the client whose size fills the pool; "
            "clients are named by the guard's --guard.client-from rule, at most --guard.max-clients, the rest "
            "'other'. Empty unless the exporter runs the guard.",
            [
                q("llamacpp_guard_client_pool_tokens{G}", "{{client}}", "A"),
                q("llamacpp_guard_pool_limit_tokens{G}", "pool", "B"),
            ],
            unit="short",
            stack=True,
            axis_label="tokens (KV cells)",
            overrides=[capacity_line("B", unstacked=True)],
        )
    )
