"""One slot as far as the log tells: the KV cells it holds, its checkpoints, and its request's forecast inputs. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field

from exporter.logs import events as ev


@dataclass(frozen=True)
class Checkpoint:
    """One context checkpoint: the positions it covers and its size in host RAM."""

    pos_min: int
    pos_max: int
    size_bytes: float


@dataclass
class SlotState:
    """One slot, as far as the log tells."""

    n_ctx: int | None = None
    tokens: int = 0
    processing: bool = False
    task: int = -1
    # Tasks it has released (`stop processing`) since its server started: a turn that began and ended between
    # two scrapes still moves it (exporter.model.activity).
    turns: int = 0
    # What its last released task held (the release's n_tokens), kept when the slot is cleared: a turn that
    # began and ended between two scrapes, its cells saved to the prompt cache since, still has its size.
    last_turn: int = 0
    last_processed: int | None = None  # the tokens its timings say it processed (`total time`), when printed
    prompt_tokens: int = 0
    # Tokens kept from the cache when the current prompt started; b9151+ progress lines count on top of it.
    cache_base: int | None = None
    # What the current task's lines said of its prompt's reuse (`full_reprocess`, `checkpoint_restored`: see
    # `exporter.model.latency.cache_outcome`), and whether a prompt-cache entry was loaded into it for it.
    reuse: str | None = None
    prompt_loaded: bool = False
    # Live context checkpoints in host RAM, oldest first (llama-server keeps them in a list per slot).
    checkpoints: list[Checkpoint] = field(default_factory=list)
    # The current task's forecast inputs (exporter.model.forecast): the prompt's full size in tokens and how it
    # is known (`new_prompt` line, or `progress` lines: X / P narrowed to the bounds the rounding of P
    # allows), and the slot's latest speeds in tokens/s as llama-server printed them.
    prompt_size: int | None = None
    prompt_size_source: str | None = None
    phase: str | None = None  # prompt | generation (None: idle or not known)
    prompt_rate: float | None = None
    generation_rate: float | None = None
    # Remaining generation budget in tokens (None = unknown or unlimited); only /slots tells (live view).
    generation_budget: int | None = None
    _size_bounds: tuple[float, float] | None = None
    # The last progress line's (new tokens X, fraction P): P counts the cached prefix, which only
    # `-lv 4` or /slots (n_prompt_tokens_cache) tells; `size_with_cache` redoes X / P with it.
    _last_fraction: tuple[int, float] | None = None
    _last_progress: tuple[float, int] | None = None  # (seconds since the prompt started, tokens processed)

    @property
    def checkpoint_bytes(self) -> float:
        """Host RAM held by this slot's live checkpoints."""
        return sum(c.size_bytes for c in self.checkpoints)

    @property
    def last_reused(self) -> int | None:
        """The cells its last released task found in place or restored from the prompt cache: that
        conversation's earlier size (what it held less what it processed; the last token is never stored)."""
        done = self.last_processed
        return None if done is None else max(0, self.last_turn + 1 - done)

    def clear(self) -> None:
        """`prompt_clear`: the slot's tokens and (b11434: `prompt.clear()`) its checkpoints are gone."""
        self.tokens = 0
        self.checkpoints = []

    def new_task(self) -> None:
        """A task starts or ends: forget the previous task's prompt size and speeds."""
        if self.phase is None:  # set whenever any of them is: nothing to forget (the common idle case)
            return
        self.prompt_size = self.prompt_size_source = self.phase = None
        self.prompt_rate = self.generation_rate = None
        self._size_bounds = self._last_progress = self._last_fraction = None

    def size_with_cache(self, cached: int) -> int | None:
        """The prompt size from the last progress line, given the cached prefix (from /slots) the log hid."""
        if self.prompt_size_source != "progress" or self.cache_base is not None or self._last_fraction is None:
            return None
        processed, fraction = self._last_fraction
        return round((cached + processed) / fraction) if fraction > 0 else None

    def note_prompt_progress(self, e: ev.PromptProgress, held: int, throughput: float | None = None) -> float | None:
        """Prompt size and speed from a progress line (`held`: the slot's tokens after this batch).

        `throughput` is the server's latest prompt speed (from another slot): a slot's first line
        averages over its whole wait, so it is not the speed now. Returns the speed measured between
        this line and the slot's previous one, when there is one (the server's speed now).
        """
        self.phase = "prompt"
        if e.progress is not None and not e.absolute:
            self._last_fraction = (e.n_tokens, e.progress)
        if e.progress is not None and e.progress > 0 and self.prompt_size_source != "new_prompt":
            # P is printed with 2 decimals (b9151+; %f before): the size lies where X / P rounds to P.
            half = 0.005 if e.progress * 100 == round(e.progress * 100) and not e.absolute else 5e-7
            lo, hi = held / (e.progress + half), held / max(e.progress - half, 1e-9)
            if self._size_bounds is not None:
                both = max(lo, self._size_bounds[0]), min(hi, self._size_bounds[1])
                if both[0] <= both[1]:  # else contradicting lines (a new prompt in the same task): start again
                    lo, hi = both
            self._size_bounds = (lo, hi)
            self.prompt_size = max(held, round((lo + hi) / 2)) if e.progress < 1 else held
            self.prompt_size_source = "progress"
            self.prompt_tokens = self.prompt_size  # what generation lines count on top of
        measured = None
        if e.seconds is not None and e.rate is not None:
            last = self._last_progress
            # The line's rate is the average since the prompt started; two lines give the current one.
            if last is not None and e.seconds > last[0] and e.n_tokens > last[1]:
                measured = (e.n_tokens - last[1]) / (e.seconds - last[0])
            self.prompt_rate = measured or throughput or e.rate
            self._last_progress = (e.seconds, e.n_tokens)
        return measured
