"""What goes wrong: a full pool's retries, failed decodes, aborted requests, a crash's cause, rejected lines."""

from __future__ import annotations

from typing import TypeAlias

from exporter.logs.event_class import Traits, event


@event
class MemorySlotFailure:
    """Library warning `decode: failed to find a memory slot for batch of size N` (and older wordings)."""

    TRAITS = Traits(counted=True)

    batch_size: int


@event
class KVRetry:
    """`failed to find free space in the KV cache, retrying with smaller batch size, off|i = O, n_batch = B`."""

    TRAITS = Traits(counted=True)

    offset: int
    n_batch: int


@event
class DecodeFatal:
    """`Context size has been exceeded. off = 3, n_batch = 1, ret = 1` and its relatives: the batch is lost.

    `reason` is one of `context_exceeded`, `invalid_batch`, `compute_error`, `kv_cache_full` (pre-b5448).
    """

    TRAITS = Traits(series=True)

    reason: str


@event
class DecodeFailed:
    """`decode() failed: Context size has been exceeded.` (b9752+), after every in-flight slot was aborted."""

    TRAITS = Traits(demand="shrinks")

    message: str


@event
class RequestError:
    """`send_error: task id = N, error: MESSAGE`: one client request ended with a server error."""

    TRAITS = Traits(abort_trail=True)

    task: int
    reason: str


@event
class CrashCause:
    """A crash's cause in ggml's words (`CUDA error: out of memory`, ggml_abort's `file:line: message` before
    abort(), see `rules`). `message`: the line, at most 300 characters, for `diagnose`; never a label."""

    cause: str
    message: str


@event
class Rejected:
    """A line that looked like a metric line but cannot be true: it is counted, never applied.

    `reason` is bounded: `malformed` (a number that cannot be read, e.g. `1.2.3` or thousands of
    digits) from the parser; the state adds `out_of_range` (a slot id, count or size that the running
    server cannot have written), `format` (a line not written the way its run writes lines) and
    `inconsistent` (a line that contradicts what the run said before; see `exporter.model.provenance`).
    """

    reason: str


#: `RequestError` reasons of a request aborted by a failed decode (its slot is cleared, its task was in flight).
FATAL_REASONS: frozenset[str] = frozenset({"context_exceeded", "invalid_batch", "compute_error"})


#: The kinds of this family (`exporter.logs.events.Event` is the union of the families').
ErrorEvent: TypeAlias = MemorySlotFailure | KVRetry | DecodeFatal | DecodeFailed | RequestError | CrashCause | Rejected

__all__ = [
    "FATAL_REASONS",
    "CrashCause",
    "DecodeFailed",
    "DecodeFatal",
    "ErrorEvent",
    "KVRetry",
    "MemorySlotFailure",
    "Rejected",
    "RequestError",
]
