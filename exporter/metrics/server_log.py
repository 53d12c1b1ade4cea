"""What the llama-server log says: slots, the KV pool, retry cascades, aborts (`ServerLogCollector`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from exporter.metrics.catalogue import server as c
from exporter.model.state import ServerState
from exporter.model.view import ServerView


class ServerLogCollector(Collector):
    """Slots, KV pool and retry cascades of llama-server, from its log.

    # HELP llamacpp_kv_pool_usage_ratio KV cells held by all slots divided by the pool capacity (1 = full; …
    # TYPE llamacpp_kv_pool_usage_ratio gauge
    llamacpp_kv_pool_usage_ratio 0.75
    # HELP llamacpp_slot_tokens KV cells the slot holds now (/slots n_prompt_tokens when available, else …
    # TYPE llamacpp_slot_tokens gauge
    llamacpp_slot_tokens{slot="0"} 128.0
    # HELP llamacpp_kv_cascades_total Retry cascades (batch halving after a full KV pool) by outcome.
    # TYPE llamacpp_kv_cascades_total counter
    llamacpp_kv_cascades_total{outcome="failed"} 1.0
    llamacpp_kv_cascades_total{outcome="recovered"} 0.0
    """

    def __init__(self, view: Callable[[], ServerView]) -> None:
        self._view = view  # the unit's view of this scrape

    def collect(self) -> Iterator[Metric]:
        """Yield the log-derived metric families."""
        st = self._view().state
        yield from self._info(st)
        yield from self._slots(st)
        yield from self._pool(st)
        yield from self._counters(st)

    def _info(self, st: ServerState) -> Iterator[Metric]:
        _, source = st.pool_capacity()
        info = c.SERVER_INFO.info()
        kv_unified = "unknown" if st.run.kv_unified is None else str(st.run.kv_unified).lower()
        info.add_metric(
            [],
            {
                "build": f"b{st.run.build}" if st.run.build is not None else "unknown",
                "model": st.run.model or "unknown",
                "kv_unified": kv_unified,
                "type_k": st.run.type_k or "unknown",
                "type_v": st.run.type_v or "unknown",
                "capacity_source": source,
            },
        )
        yield info

    def _slots(self, st: ServerState) -> Iterator[Metric]:
        count = st.run.slot_count
        if count is None:
            return
        yield c.SLOTS.gauge(count)
        ctx, tokens, busy = c.SLOT_CONTEXT_TOKENS.gauge(), c.SLOT_TOKENS.gauge(), c.SLOT_PROCESSING.gauge()
        for i in range(count):
            s = st.run.slots.get(i)
            label = [str(i)]
            n_ctx = st.run.slot_context(i)
            if n_ctx is not None:
                ctx.add_metric(label, n_ctx)
            tokens.add_metric(label, s.tokens if s else 0)
            busy.add_metric(label, 1 if s and s.processing else 0)
        yield ctx
        yield tokens
        yield busy

    def _pool(self, st: ServerState) -> Iterator[Metric]:
        capacity, _ = st.pool_capacity()
        used = st.run.pool_used()
        yield c.KV_POOL_USED_TOKENS.gauge(used)
        if capacity:
            yield c.KV_POOL_CAPACITY_TOKENS.gauge(capacity)
            yield c.KV_POOL_USAGE_RATIO.gauge(used / capacity)
        over = st.overcommit_ratio()
        if over is not None:
            yield c.KV_POOL_OVERCOMMIT_RATIO.gauge(over)
        if st.run.kv_k_bytes or st.run.kv_v_bytes:
            kv = c.KV_CACHE_BYTES.gauge()
            kv.add_metric(["k"], st.run.kv_k_bytes)
            kv.add_metric(["v"], st.run.kv_v_bytes)
            yield kv
        yield c.KV_CASCADE_ACTIVE.gauge(1 if st.run.in_cascade else 0)

    def _counters(self, st: ServerState) -> Iterator[Metric]:
        yield server_starts_family(st)
        yield server_crashes_family(st)
        for family, kind in c.EVENT_COUNTERS:
            yield family.counter(st.counted[kind])
        yield c.KV_CASCADES.counts(st.cascades)
        yield c.CONTEXT_EXCEEDED.counter(st.context_exceeded)
        yield c.DECODE_FAILURES.counts(st.decode_failures)
        yield c.REQUESTS_ABORTED.counts(st.requests_aborted)
        yield c.SLOTS_PURGED.counter(st.slots_purged)
        yield rejected_lines_family(st)


def server_crashes_family(st: ServerState) -> CounterMetricFamily:
    """`llamacpp_server_crashes_total{cause}` of a server: runs that ended without their exit line."""
    return c.SERVER_CRASHES.counts(st.server_crashes)


def server_starts_family(st: ServerState) -> CounterMetricFamily:
    """`llamacpp_server_starts_total` of a server (or of a router itself)."""
    return c.SERVER_STARTS.counter(st.server_starts)


def rejected_lines_family(st: ServerState) -> CounterMetricFamily:
    """`llamacpp_exporter_log_lines_rejected_total` of a server (or of a router itself)."""
    return c.EXPORTER_LOG_LINES_REJECTED.counts(st.rejected)
