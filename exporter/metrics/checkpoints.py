"""Host RAM outside the KV cache: context checkpoints, the prompt cache, prompt timings."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from exporter.metrics.catalogue import server as c
from exporter.model.state import ServerState
from exporter.model.view import ServerView


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

    def __init__(self, view: Callable[[], ServerView]) -> None:
        self._view = view  # the unit's view of this scrape

    def collect(self) -> Iterator[Metric]:
        """Yield checkpoint, prompt-cache and timing families."""
        st = self._view().state
        visible = st.run.checkpoint_lines_visible()
        if visible is not None:
            yield c.CHECKPOINT_LINES_VISIBLE.gauge(1 if visible else 0)
        if visible is not False:
            yield from self._checkpoints(st)
            yield from self._prompt_cache(st)
        yield from self._limits(st)
        yield from self._timings(st)

    def _limits(self, st: ServerState) -> Iterator[Metric]:
        """Configuration, from start-up lines or the command line: true whatever the verbosity."""
        if st.run.checkpoint_limit is not None:
            yield c.CHECKPOINT_LIMIT.gauge(st.run.checkpoint_limit)
        if st.run.prompt_cache_limit_bytes is not None:
            yield c.PROMPT_CACHE_LIMIT_BYTES.gauge(st.run.prompt_cache_limit_bytes)

    def _checkpoints(self, st: ServerState) -> Iterator[Metric]:
        count = st.run.slot_count
        if count is not None:
            n, size = c.CHECKPOINTS.gauge(), c.CHECKPOINT_BYTES.gauge()
            for i in range(count):
                s = st.run.slots.get(i)
                n.add_metric([str(i)], len(s.checkpoints) if s else 0)
                size.add_metric([str(i)], s.checkpoint_bytes if s else 0.0)
            yield n
            yield size
        yield c.CHECKPOINT_EVENTS.counts(st.checkpoint_events)
        yield c.FULL_REPROCESS.counter(st.full_reprocess)

    def _prompt_cache(self, st: ServerState) -> Iterator[Metric]:
        if st.run.prompt_cache_bytes is not None:
            yield c.PROMPT_CACHE_BYTES.gauge(st.run.prompt_cache_bytes)
        if st.run.prompt_cache_prompts is not None:
            yield c.PROMPT_CACHE_PROMPTS.gauge(st.run.prompt_cache_prompts)

    def _timings(self, st: ServerState) -> Iterator[Metric]:
        yield c.PROMPT_EVAL_SECONDS.histogram(st.prompt_eval_seconds)
        yield c.PROMPT_TOKENS.counter(st.prompt_tokens)
        yield c.GENERATED_TOKENS.counter(st.generated_tokens)
