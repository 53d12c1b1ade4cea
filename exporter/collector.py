"""prometheus_client collectors: fresh metric families on every scrape, built from `ServerState`.

One collector per area, like prometheus-pve-exporter: `ServerLogCollector` for what the llama-server
log says, `ExporterCollector` for the exporter's own health. Each docstring shows sample output.
Nothing here mutates state; scrapes run on the same asyncio loop that applies log events, so a
scrape always sees a consistent state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from exporter import __version__
from exporter.forecast import HORIZONS, forecast
from exporter.state import PROMPT_EVAL_BUCKETS, ServerState

CASCADE_OUTCOMES = ("recovered", "failed")
ABORT_REASONS = ("context_exceeded",)
DECODE_FAILURE_REASONS = ("context_exceeded", "invalid_batch", "compute_error")
REJECT_REASONS = ("malformed", "out_of_range", "format", "inconsistent", "unexpected", "unfollowed")


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _labelled_counter(
    name: str, doc: str, label: str, values: Mapping[str, int], always: Iterable[str]
) -> CounterMetricFamily:
    """A counter with one bounded label; the `always` values are exported at 0 so rate() and alerts work."""
    family = CounterMetricFamily(name, doc, labels=[label])
    for key in sorted(set(always) | set(values)):
        family.add_metric([key], values.get(key, 0))
    return family


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

    def __init__(self, state: Callable[[], ServerState]) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        """Yield the log-derived metric families."""
        st = self._state()
        yield from self._info(st)
        yield from self._slots(st)
        yield from self._pool(st)
        yield from self._counters(st)

    def _info(self, st: ServerState) -> Iterator[Metric]:
        _, source = st.pool_capacity()
        info = InfoMetricFamily("llamacpp_server", "What llama-server runs, from its start-up log lines.")
        kv_unified = "unknown" if st.kv_unified is None else str(st.kv_unified).lower()
        info.add_metric(
            [],
            {
                "build": f"b{st.build}" if st.build is not None else "unknown",
                "model": st.model or "unknown",
                "kv_unified": kv_unified,
                "type_k": st.type_k or "unknown",
                "type_v": st.type_v or "unknown",
                "capacity_source": source,
            },
        )
        yield info

    def _slots(self, st: ServerState) -> Iterator[Metric]:
        count = st.slot_count
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
            s = st.slots.get(i)
            label = [str(i)]
            n_ctx = st.slot_context(i)
            if n_ctx is not None:
                ctx.add_metric(label, n_ctx)
            tokens.add_metric(label, s.tokens if s else 0)
            busy.add_metric(label, 1 if s and s.processing else 0)
        yield ctx
        yield tokens
        yield busy

    def _pool(self, st: ServerState) -> Iterator[Metric]:
        capacity, _ = st.pool_capacity()
        used = st.pool_used()
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
        if st.kv_k_bytes or st.kv_v_bytes:
            kv = GaugeMetricFamily(
                "llamacpp_kv_cache_bytes",
                "KV cache memory from the llama_kv_cache size line.",
                labels=["kind"],
            )
            kv.add_metric(["k"], st.kv_k_bytes)
            kv.add_metric(["v"], st.kv_v_bytes)
            yield kv
        active = GaugeMetricFamily(
            "llamacpp_kv_cascade_active", "1 while a KV retry cascade is in progress (batch halving)."
        )
        active.add_metric([], 1 if st.in_cascade else 0)
        yield active

    def _counters(self, st: ServerState) -> Iterator[Metric]:
        yield server_starts_family(st)
        yield _counter(
            "llamacpp_kv_retries",
            "'retrying with smaller batch size' lines: the KV pool had no room.",
            st.kv_retries,
        )
        yield _counter(
            "llamacpp_kv_memory_slot_failures",
            "'failed to find a memory slot for batch' library warnings.",
            st.memory_slot_failures,
        )
        yield _labelled_counter(
            "llamacpp_kv_cascades",
            "Retry cascades (batch halving after a full KV pool) by outcome.",
            "outcome",
            st.cascades,
            CASCADE_OUTCOMES,
        )
        yield _counter(
            "llamacpp_context_exceeded",
            "Decode failures 'Context size has been exceeded': every in-flight request was aborted.",
            st.context_exceeded,
        )
        yield _labelled_counter(
            "llamacpp_decode_failures",
            "Fatal decode errors by reason.",
            "reason",
            st.decode_failures,
            DECODE_FAILURE_REASONS,
        )
        yield _labelled_counter(
            "llamacpp_requests_aborted",
            "Requests ended by a server error (send_error), by reason.",
            "reason",
            st.requests_aborted,
            ABORT_REASONS,
        )
        yield _counter(
            "llamacpp_slots_purged", "Idle slots purged to make room in the unified KV pool.", st.slots_purged
        )
        yield rejected_lines_family(st)


def server_starts_family(st: ServerState) -> CounterMetricFamily:
    """`llamacpp_server_starts_total` of a server (or of a router itself)."""
    return _counter(
        "llamacpp_server_starts",
        "llama-server starts seen (a new banner in the log or a new process in /proc, each start counted once).",
        st.server_starts,
    )


def rejected_lines_family(st: ServerState) -> CounterMetricFamily:
    """`llamacpp_exporter_log_lines_rejected_total` of a server (or of a router itself)."""
    return _labelled_counter(
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


class KVForecastCollector(Collector):
    """Where the KV pool is heading: demand of the requests in flight and the time until it is full.

    See `exporter.forecast` for the model. Demand is exported for both horizons whenever the slot
    count is known (0 with nothing in flight); the ETA only while the pool fills towards full.

    # HELP llamacpp_kv_pool_demand_tokens KV cells the requests in flight will hold: horizon="prompt" once …
    # TYPE llamacpp_kv_pool_demand_tokens gauge
    llamacpp_kv_pool_demand_tokens{horizon="prompt"} 36000.0
    llamacpp_kv_pool_demand_tokens{horizon="limits"} 36000.0
    llamacpp_kv_pool_demand_tokens{horizon="max"} 65536.0
    # HELP llamacpp_kv_pool_demand_ratio llamacpp_kv_pool_demand_tokens / llamacpp_kv_pool_capacity_tokens …
    # TYPE llamacpp_kv_pool_demand_ratio gauge
    llamacpp_kv_pool_demand_ratio{horizon="prompt"} 1.0986328125
    # HELP llamacpp_kv_pool_full_eta_seconds Seconds until the requests in flight fill the KV pool at …
    # TYPE llamacpp_kv_pool_full_eta_seconds gauge
    llamacpp_kv_pool_full_eta_seconds 84.2
    # HELP llamacpp_kv_pool_demand_slots Processing slots by how their prompt size is known: …
    # TYPE llamacpp_kv_pool_demand_slots gauge
    llamacpp_kv_pool_demand_slots{source="new_prompt"} 0.0
    llamacpp_kv_pool_demand_slots{source="progress"} 3.0
    llamacpp_kv_pool_demand_slots{source="held"} 1.0
    """

    def __init__(self, state: Callable[[], ServerState]) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        """Yield the forecast families."""
        st = self._state()
        count = st.slot_count
        if count is None:
            return
        f = forecast(st)
        sources = "prompt sizes from 'new prompt' lines (-lv 4) or progress lines (X / progress), else the cells held"
        demand = GaugeMetricFamily(
            "llamacpp_kv_pool_demand_tokens",
            'KV cells the requests in flight will hold: horizon="prompt" once their prompts are processed, '
            'horizon="max" at most (plus the generation budget left, from /slots; unknown = the slot\'s whole '
            'window), horizon="limits" as max but a request without a known budget counts its prompt; idle '
            f"slots excluded ({sources}).",
            labels=["horizon"],
        )
        for h in HORIZONS:
            demand.add_metric([h], f.demand(h))
        yield demand
        if f.capacity:
            ratio = GaugeMetricFamily(
                "llamacpp_kv_pool_demand_ratio",
                "llamacpp_kv_pool_demand_tokens / llamacpp_kv_pool_capacity_tokens; above 1 the pool overflows "
                "(and llama-server aborts every request in flight) unless a request ends first.",
                labels=["horizon"],
            )
            for h in HORIZONS:
                ratio.add_metric([h], f.demand(h) / f.capacity)
            yield ratio
        eta = f.eta_seconds
        if eta is not None:
            yield GaugeMetricFamily(
                "llamacpp_kv_pool_full_eta_seconds",
                "Seconds until the requests in flight fill the KV pool at their current speed (llama-server's "
                "own prompt and generation speeds); absent when the pool is not filling or cannot fill.",
                value=eta,
            )
        yield GaugeMetricFamily(
            "llamacpp_kv_pool_fill_rate_tokens_per_second",
            "Tokens per second the requests in flight add to the KV pool (latest prompt-processing and "
            "generation speeds in the log).",
            value=f.fill_rate,
        )
        by_source = GaugeMetricFamily(
            "llamacpp_kv_pool_demand_slots",
            "Processing slots by how their prompt size is known: new_prompt (-lv 4 line), progress (progress "
            "lines, default verbosity), held (not known yet: counts the cells it holds).",
            labels=["source"],
        )
        for name, n in f.sources().items():
            by_source.add_metric([name], n)
        yield by_source
        yield GaugeMetricFamily(
            "llamacpp_kv_pool_demand_unknown_budget_slots",
            "Processing slots whose generation budget is unknown or unlimited (counted at their whole window "
            "in the max horizon); /slots (--server-url) gives it.",
            value=f.unknown_budgets,
        )
        per_slot = GaugeMetricFamily(
            "llamacpp_slot_demand_tokens",
            "KV cells the slot's request will hold once its prompt is processed (horizon=prompt) and at most "
            "(horizon=max); 0 while the slot is idle.",
            labels=["slot", "horizon"],
        )
        by_slot = {d.slot: d for d in f.slots}
        for i in range(count):
            d = by_slot.get(i)
            per_slot.add_metric([str(i), "prompt"], d.prompt if d else 0)
            per_slot.add_metric([str(i), "max"], d.max if d else 0)
        yield per_slot


class LogSourceStatus(Protocol):
    """What the exporter knows about its log source (implemented by `pipeline.LogPipeline`)."""

    @property
    def up(self) -> bool: ...
    @property
    def lines(self) -> int: ...
    @property
    def replayed_lines(self) -> int: ...
    @property
    def truncations(self) -> int: ...
    @property
    def rotations(self) -> int: ...
    @property
    def lost_bytes(self) -> int: ...
    @property
    def long_lines(self) -> int: ...
    @property
    def understood(self) -> bool | None: ...


@dataclass
class SourceHealth:
    """Last result of one live source, for `llamacpp_exporter_source_up`."""

    up: bool = False


class ExporterCollector(Collector):
    """The exporter's own health: sources, tailer counters, build info.

    # HELP llamacpp_exporter_source_up 1 when the last read of the source worked.
    # TYPE llamacpp_exporter_source_up gauge
    llamacpp_exporter_source_up{source="log"} 1.0
    # HELP llamacpp_exporter_log_lines_total Log lines read while running (not counting the start-up replay).
    # TYPE llamacpp_exporter_log_lines_total counter
    llamacpp_exporter_log_lines_total 412.0
    """

    def __init__(self, log: LogSourceStatus, sources: Mapping[str, SourceHealth] | None = None) -> None:
        self._log = log
        self._sources = sources or {}

    def collect(self) -> Iterator[Metric]:
        """Yield the exporter's self-metrics."""
        yield source_up_family(self._log.up, self._sources)
        log = self._log
        yield _counter(
            "llamacpp_exporter_log_lines",
            "Log lines read while running (not counting the start-up replay).",
            log.lines,
        )
        yield GaugeMetricFamily(
            "llamacpp_exporter_log_replayed_lines",
            "Lines of the existing log replayed at start to rebuild gauges (not counted as events).",
            value=log.replayed_lines,
        )
        yield _counter(
            "llamacpp_exporter_log_truncations",
            "Times the log file shrank or was rewritten in place.",
            log.truncations,
        )
        yield _counter(
            "llamacpp_exporter_log_rotations",
            "Times the log path named a new file (rotation, re-creation).",
            log.rotations,
        )
        yield _counter(
            "llamacpp_exporter_log_lost_bytes",
            "Bytes known to be lost, e.g. written just before a copytruncate.",
            log.lost_bytes,
        )
        if log.understood is not None:
            yield GaugeMetricFamily(
                "llamacpp_exporter_log_understood",
                "1 once a line that only llama-server writes was read; 0 when the first 1000 lines held none "
                "(not llama-server's log, or its format is not known).",
                value=1 if log.understood else 0,
            )
        yield _counter(
            "llamacpp_exporter_log_long_lines",
            "Lines cut because they exceeded the maximum line length.",
            log.long_lines,
        )
        info = InfoMetricFamily("llamacpp_exporter_build", "Version of llamacpp-exporter.")
        info.add_metric([], {"version": __version__})
        yield info


def source_up_family(log_up: bool | None, sources: Mapping[str, SourceHealth]) -> GaugeMetricFamily:
    """`llamacpp_exporter_source_up{source}`: the log's (unless None: a router child shares its router's log)
    and each live source's."""
    up = GaugeMetricFamily(
        "llamacpp_exporter_source_up", "1 when the last read of the source worked.", labels=["source"]
    )
    if log_up is not None:
        up.add_metric(["log"], 1 if log_up else 0)
    for name, health in sorted(sources.items()):
        up.add_metric([name], 1 if health.up else 0)
    return up


class SourcesUpCollector(Collector):
    """`llamacpp_exporter_source_up` of a router child's live sources (its log is the router's).

    # HELP llamacpp_exporter_source_up 1 when the last read of the source worked.
    # TYPE llamacpp_exporter_source_up gauge
    llamacpp_exporter_source_up{source="http"} 1.0
    """

    def __init__(self, sources: Mapping[str, SourceHealth]) -> None:
        self._sources = sources

    def collect(self) -> Iterator[Metric]:
        """Yield the one family."""
        yield source_up_family(None, self._sources)


CHECKPOINT_EVENTS = ("created", "restored", "invalidated", "evicted", "failed_restore")


class CheckpointCacheCollector(Collector):
    """Host RAM outside the KV cache: context checkpoints per slot, the prompt cache, prompt timings.

    At `-lv 3` on b9829+ the checkpoint and prompt-cache lines are hidden (trace level): then those
    families are left out and `llamacpp_checkpoint_lines_visible 0` says why, instead of zeros that
    would look like truth.

    # HELP llamacpp_checkpoint_bytes Host RAM held by the slot's live context checkpoints.
    # TYPE llamacpp_checkpoint_bytes gauge
    llamacpp_checkpoint_bytes{slot="0"} 786432000.0
    # HELP llamacpp_prompt_eval_seconds Prompt evaluation time per request (prompt eval time lines).
    # TYPE llamacpp_prompt_eval_seconds histogram
    llamacpp_prompt_eval_seconds_bucket{le="0.005"} 4.0
    """

    def __init__(self, state: Callable[[], ServerState]) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        """Yield checkpoint, prompt-cache and timing families."""
        st = self._state()
        visible = st.checkpoint_lines_visible()
        if visible is not None:
            yield GaugeMetricFamily(
                "llamacpp_checkpoint_lines_visible",
                "1 when the log shows checkpoint and prompt-cache lines; 0 when its verbosity hides them (use -lv 4).",
                value=1 if visible else 0,
            )
        if visible is not False:
            yield from self._checkpoints(st)
            yield from self._prompt_cache(st)
        yield from self._limits(st)
        yield from self._timings(st)

    def _limits(self, st: ServerState) -> Iterator[Metric]:
        """Configuration, from start-up lines or the command line: true whatever the verbosity."""
        if st.checkpoint_limit is not None:
            yield GaugeMetricFamily(
                "llamacpp_checkpoint_limit",
                "Maximum context checkpoints per slot (--ctx-checkpoints; 0 = disabled).",
                value=st.checkpoint_limit,
            )
        if st.prompt_cache_limit_bytes is not None:
            yield GaugeMetricFamily(
                "llamacpp_prompt_cache_limit_bytes",
                "Prompt cache size limit (--cache-ram); +Inf = no limit, 0 = disabled.",
                value=st.prompt_cache_limit_bytes,
            )

    def _checkpoints(self, st: ServerState) -> Iterator[Metric]:
        count = st.slot_count
        if count is not None:
            n = GaugeMetricFamily("llamacpp_checkpoints", "Live context checkpoints of the slot.", labels=["slot"])
            size = GaugeMetricFamily(
                "llamacpp_checkpoint_bytes", "Host RAM held by the slot's live context checkpoints.", labels=["slot"]
            )
            for i in range(count):
                s = st.slots.get(i)
                n.add_metric([str(i)], len(s.checkpoints) if s else 0)
                size.add_metric([str(i)], s.checkpoint_bytes if s else 0.0)
            yield n
            yield size
        yield _labelled_counter(
            "llamacpp_checkpoint_events",
            "Context checkpoint events: created, restored, invalidated, evicted, failed_restore.",
            "event",
            st.checkpoint_events,
            CHECKPOINT_EVENTS,
        )
        yield _counter(
            "llamacpp_full_reprocess",
            "'forcing full prompt re-processing': no usable checkpoint or cache, the prompt ran from scratch.",
            st.full_reprocess,
        )

    def _prompt_cache(self, st: ServerState) -> Iterator[Metric]:
        if st.prompt_cache_bytes is not None:
            yield GaugeMetricFamily(
                "llamacpp_prompt_cache_bytes",
                "Host RAM used by the prompt cache (last 'cache state' line).",
                value=st.prompt_cache_bytes,
            )
        if st.prompt_cache_prompts is not None:
            yield GaugeMetricFamily(
                "llamacpp_prompt_cache_prompts", "Prompts held in the prompt cache.", value=st.prompt_cache_prompts
            )

    def _timings(self, st: ServerState) -> Iterator[Metric]:
        buckets: list[tuple[str, float]] = []
        cumulative = 0
        for bound, n in zip(PROMPT_EVAL_BUCKETS, st.prompt_eval_buckets, strict=True):
            cumulative += n
            buckets.append((str(bound), cumulative))
        buckets.append(("+Inf", st.prompt_eval_count))
        yield HistogramMetricFamily(
            "llamacpp_prompt_eval_seconds",
            "Prompt evaluation time per finished request ('prompt eval time' lines; cached tokens excluded).",
            buckets=buckets,
            sum_value=st.prompt_eval_seconds_sum,
        )
        yield _counter("llamacpp_prompt_tokens", "Prompt tokens evaluated (cached tokens excluded).", st.prompt_tokens)
        yield _counter("llamacpp_generated_tokens", "Tokens generated ('eval time' lines).", st.generated_tokens)
