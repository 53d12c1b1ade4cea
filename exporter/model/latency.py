"""Request latency as llama-server's `print_timing` lines tell it, and why a first token was slow. Pure.

For every finished request llama-server prints, at its default verbosity (b9230+ each line slot-tagged,
before that as continuation lines after a `TimingsHead`):

    prompt eval time =  X ms /   N tokens   -> time to first token X, prompt tokens evaluated N
           eval time =  Y ms /   G tokens   -> time per output token Y / G, generated tokens G
          total time =  Z ms / N+G tokens   -> request duration Z (= X + Y)

Time to first token is the prompt's evaluation as the log measures it: from the slot starting the
prompt to its first sampled token. The log never shows the time a request waited for a slot or for the
HTTP layer, so that is not in it (the guard's queue wait is its own histogram).

Each first token is labelled by the cache outcome the log shows for its request (`cache_outcome`, the
one precedence): a full re-processing, a restored context checkpoint, a prompt mostly from the slot's
cache or the prompt cache, or a cold prompt; `unknown` where the log hides the cache lines (llama-server
prints `cached n_tokens` only at `-lv 4`).

Buckets are fixed per family, the same for every server, so that histograms of several servers add up.

    >>> lat = RequestLatency()
    >>> lat.prompt_evaluated("cold", 1500.0, 3000, 0)
    >>> lat.generated(200.0, 40)
    >>> lat.finished(1700.0)
    >>> lat.ttft["cold"].count, lat.ttft["cold"].sum, lat.tpot.sum, lat.duration.sum
    (1, 1.5, 0.005, 1.7)
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from exporter.model.histogram import Histogram

#: The cache outcome of a request's prompt (the `cache` label of the time to first token), in precedence order.
CACHE_OUTCOMES: tuple[str, ...] = ("full_reprocess", "checkpoint_restored", "cached", "cold", "unknown")

#: Time to first token in seconds: 10 ms (a cached few-token prompt on a GPU) to 10 minutes (a full
#: re-processing of a long context on a CPU); 15 buckets, 18 series for each cache outcome.
TTFT_BUCKETS: tuple[float, ...] = (
    *(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
    *(5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0),
)
#: Time per output token in seconds: 1 ms (a small model on a GPU, 1000 tokens/s) to 2 s (a large model
#: offloaded to a CPU, 0.5 tokens/s); 13 buckets.
TPOT_BUCKETS: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0, 2.0)
#: End-to-end request time in seconds: 50 ms to 30 minutes (long agentic generations on a CPU); 14 buckets.
DURATION_BUCKETS: tuple[float, ...] = (
    *(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
    *(10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0),
)
#: Tokens per request (prompt evaluated, generated): 1 to 1Mi, each bucket 4 times the last; 11 buckets.
TOKEN_BUCKETS: tuple[float, ...] = tuple(float(4**i) for i in range(11))


#: Why a request ended: how llama-server's debug lines say it stopped generating (`stopped by EOS`, `… by limit`,
#: `… by time limit`, `… by indentation limit`, `… due to running out of context capacity`), or the error it
#: ended with (`send_error`: `cancelled`, or any other reason: `error`).
FINISH_REASONS: tuple[str, ...] = (
    *("eos", "limit", "time_limit", "indentation_limit", "context_capacity"),
    *("cancelled", "error"),
)


def cache_outcome(reuse: str | None, cached_tokens: int | None, evaluated: int, prompt_loaded: bool = False) -> str:
    """The cache outcome of one request's prompt: the one place that decides it.

    `reuse` is what the slot's lines said during the task (`full_reprocess`: `forcing full prompt
    re-processing`; `checkpoint_restored`: `restored context checkpoint`), the first in `CACHE_OUTCOMES`'
    order winning; `cached_tokens` the first `cached n_tokens = N` of the task (None: not shown);
    `evaluated` the tokens its `prompt eval time` line counts; `prompt_loaded` that a prompt-cache entry
    was loaded into the slot for it (`found better prompt`).

    `cached`: at least half of the prompt came from a cache (N >= evaluated, N > 0); `cold`: less (the
    evaluation dominates the first token as if nothing were reused).

    >>> cache_outcome("full_reprocess", 0, 900), cache_outcome(None, 250, 10), cache_outcome(None, 0, 10)
    ('full_reprocess', 'cached', 'cold')
    >>> cache_outcome(None, None, 10), cache_outcome(None, None, 10, prompt_loaded=True)
    ('unknown', 'cached')
    """
    if reuse is not None:
        return reuse
    if cached_tokens is None:
        return "cached" if prompt_loaded else "unknown"
    return "cached" if cached_tokens > 0 and cached_tokens >= evaluated else "cold"


def _by_outcome() -> dict[str, Histogram]:
    return {outcome: Histogram(TTFT_BUCKETS) for outcome in CACHE_OUTCOMES}


@dataclass
class RequestLatency:
    """The latency histograms and cache counters of one server, from the `print_timing` lines of its requests."""

    ttft: dict[str, Histogram] = field(default_factory=_by_outcome)  # seconds, by cache outcome
    tpot: Histogram = field(default_factory=lambda: Histogram(TPOT_BUCKETS))  # seconds per generated token
    duration: Histogram = field(default_factory=lambda: Histogram(DURATION_BUCKETS))  # seconds, end to end
    prompt_tokens: Histogram = field(default_factory=lambda: Histogram(TOKEN_BUCKETS))  # evaluated, per request
    generation_tokens: Histogram = field(default_factory=lambda: Histogram(TOKEN_BUCKETS))  # per request
    cached_tokens: int = 0  # prompt tokens served from a cache (the slot's, a prompt-cache entry, a checkpoint)
    reprocessed_tokens: int = 0  # prompt tokens evaluated again by a full re-processing
    finish_reasons: Counter[str] = field(default_factory=Counter)  # FINISH_REASONS
    draft_accepted: int = 0  # speculative decoding: draft tokens the target model accepted
    draft_generated: int = 0  # draft tokens the draft model generated
    head_slot: int = field(default=-1, compare=False)  # the last `TimingsHead`'s slot (continuations name none)
    # The last `total time` line's tokens, until the release line after it (`SlotState.last_processed`).
    processed: int | None = field(default=None, compare=False)

    def prompt_evaluated(self, outcome: str, ms: float, tokens: int, cached: int | None) -> None:
        """A `prompt eval time` line: the first token's time, by the prompt's cache outcome."""
        self.ttft[outcome].observe(ms / 1000.0)
        self.prompt_tokens.observe(tokens)
        if cached:
            self.cached_tokens += cached
        if outcome == "full_reprocess":
            self.reprocessed_tokens += tokens

    def generated(self, ms: float, tokens: int) -> None:
        """An `eval time` line: the request's generated tokens and their mean time each (none: no time per token)."""
        self.generation_tokens.observe(tokens)
        if tokens > 0:
            self.tpot.observe(ms / tokens / 1000.0)

    def finished(self, ms: float) -> None:
        """A `total time` line: the request's end-to-end time in llama-server."""
        self.duration.observe(ms / 1000.0)
