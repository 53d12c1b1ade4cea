"""What the llama-server log says: slots, the KV pool, retry cascades, aborts (`ServerLogCollector`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from exporter.metrics.families import counter, labelled_counter
from exporter.model.run import CRASH_CAUSES
from exporter.model.state import ServerState
from exporter.model.view import ServerView

CASCADE_OUTCOMES = ("recovered", "failed")


ABORT_REASONS = ("context_exceeded",)


DECODE_FAILURE_REASONS = ("context_exceeded", "invalid_batch", "compute_error")


REJECT_REASONS = ("malformed", "out_of_range", "format", "inconsistent", "unexpected", "unfollowed")


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
        info = InfoMetricFamily("llamacpp_server", "What llama-server runs, from its start-up log lines.")
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
        yield GaugeMetricFamily("llamacpp_slots", "Number of slots (parallel sequences, -np).", value=count)
        ctx = GaugeMetricFamily(
            "llamacpp_slot_context_tokens", "The slot's context limit (n_ctx_slot).", labels=["slot"]
        )
        tokens = GaugeMetricFamily(
            "llamacpp_slot_tokens",
            "KV cells the slot holds now (/slots n_prompt_tokens when available, else the log estimate; "
            "see llamacpp_slot_tokens_source).",
            labels=["slot"],
        )
        busy = GaugeMetricFamily("llamacpp_slot_processing", "1 while the slot has a task.", labels=["slot"])
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
        yield GaugeMetricFamily(
            "llamacpp_kv_pool_used_tokens",
            "KV cells held by all slots (sum of llamacpp_slot_tokens).",
            value=used,
        )
        if capacity:
            yield GaugeMetricFamily(
                "llamacpp_kv_pool_capacity_tokens", "Cells in the KV pool (all streams).", value=capacity
            )
            yield GaugeMetricFamily(
                "llamacpp_kv_pool_usage_ratio",
                "KV cells held by all slots divided by the pool capacity (1 = full; above 1 if slots share cells).",
                value=used / capacity,
            )
        over = st.overcommit_ratio()
        if over is not None:
            yield GaugeMetricFamily(
                "llamacpp_kv_pool_overcommit_ratio",
                "Slots x per-slot context / pool capacity; above 1 the slots were promised more than the pool holds.",
                value=over,
            )
        if st.run.kv_k_bytes or st.run.kv_v_bytes:
            kv = GaugeMetricFamily(
                "llamacpp_kv_cache_bytes",
                "KV cache memory from the llama_kv_cache size line.",
                labels=["kind"],
            )
            kv.add_metric(["k"], st.run.kv_k_bytes)
            kv.add_metric(["v"], st.run.kv_v_bytes)
            yield kv
        active = GaugeMetricFamily(
            "llamacpp_kv_cascade_active", "1 while a KV retry cascade is in progress (batch halving)."
        )
        active.add_metric([], 1 if st.run.in_cascade else 0)
        yield active

    def _counters(self, st: ServerState) -> Iterator[Metric]:
        yield server_starts_family(st)
        yield server_crashes_family(st)
        yield counter(
            "llamacpp_kv_retries",
            "'retrying with smaller batch size' lines: the KV pool had no room.",
            st.kv_retries,
        )
        yield counter(
            "llamacpp_kv_memory_slot_failures",
            "'failed to find a memory slot for batch' library warnings.",
            st.memory_slot_failures,
        )
        yield labelled_counter(
            "llamacpp_kv_cascades",
            "Retry cascades (batch halving after a full KV pool) by outcome.",
            "outcome",
            st.cascades,
            CASCADE_OUTCOMES,
        )
        yield counter(
            "llamacpp_context_exceeded",
            "Decode failures 'Context size has been exceeded': every in-flight request was aborted.",
            st.context_exceeded,
        )
        yield labelled_counter(
            "llamacpp_decode_failures",
            "Fatal decode errors by reason.",
            "reason",
            st.decode_failures,
            DECODE_FAILURE_REASONS,
        )
        yield labelled_counter(
            "llamacpp_requests_aborted",
            "Requests ended by a server error (send_error), by reason.",
            "reason",
            st.requests_aborted,
            ABORT_REASONS,
        )
        yield counter(
            "llamacpp_slots_purged", "Idle slots purged to make room in the unified KV pool.", st.slots_purged
        )
        yield rejected_lines_family(st)


def server_crashes_family(st: ServerState) -> CounterMetricFamily:
    """`llamacpp_server_crashes_total{cause}` of a server: runs that ended without their exit line."""
    return labelled_counter(
        "llamacpp_server_crashes",
        "llama-server runs that ended without their exit line (crashed, killed or failed to start), counted "
        "at the next start, by the cause the run's log named: cuda/metal/vulkan_out_of_memory, ggml_assert, "
        "ggml_abort (its message before abort()), unknown (none: killed, or a crash that wrote nothing).",
        "cause",
        st.server_crashes,
        CRASH_CAUSES,
    )


def server_starts_family(st: ServerState) -> CounterMetricFamily:
    """`llamacpp_server_starts_total` of a server (or of a router itself)."""
    return counter(
        "llamacpp_server_starts",
        "llama-server starts seen (a new banner in the log or a new process in /proc, each start counted once).",
        st.server_starts,
    )


def rejected_lines_family(st: ServerState) -> CounterMetricFamily:
    """`llamacpp_exporter_log_lines_rejected_total` of a server (or of a router itself)."""
    return labelled_counter(
        "llamacpp_exporter_log_lines_rejected",
        "Log lines read but not applied: malformed (a number that cannot be read), out_of_range (a slot, "
        "count or size the running server cannot have written: forged or corrupt), format (not written the "
        "way its run writes lines: forged), inconsistent (contradicts what its run said before: forged), "
        "unexpected (an exporter bug), unfollowed (a router child's line the exporter does not follow: past the "
        "limit of children, or of a port no spawn line announced).",
        "reason",
        st.rejected,
        REJECT_REASONS,
    )
