"""Is this llama-server's log? The one rule, for the follower (`exporter.pipeline`) and for `diagnose`.

Every build's log opens with a line only llama-server writes (`build_info:`, `build:`, `common_params_print_info`,
`llama_server: initializing`, `init: initializing`, its JSON-lines form): a log is understood from its
first line. Another program's log (sshd, nginx, syslog, another program's JSON) has none; after
`UNRECOGNIZED_AFTER_LINES` lines without one, it is said not to be llama-server's, by the follower and by
`diagnose` alike (`diagnose` also on a shorter file, which it reads to its end). Binary data is refused at
once, unless it holds a llama-server line.
"""

from __future__ import annotations

from collections.abc import Iterable

from exporter.logs import events as ev
from exporter.logs.parse import parse_lines

#: Lines without a llama-server line after which a log is said not to be llama-server's.
UNRECOGNIZED_AFTER_LINES = 40
#: Undecodable bytes (as a share of those sampled) above which text is binary data.
BINARY_REPLACED_SHARE = 0.05
#: The undecodable share is told over at least this many bytes.
MIN_SAMPLE_BYTES = 1024
#: What the follower samples of a new file's first bytes to tell binary data.
SAMPLE_BYTES = 64 * 1024
#: What a person is told to give instead.
EXPECTED = "expected llama-server's --log-file output, plain, prefixed, coloured or --log-jsonl"


def specific(events: Iterable[ev.Event]) -> bool:
    """True when one of `events` comes from a line that only llama-server writes."""
    return any(type(e) not in ev.GENERIC for e in events)


def looks_binary(nul_bytes: int, replaced: int, sampled: int) -> bool:
    """Binary data: a NUL byte, or more than `BINARY_REPLACED_SHARE` of at least `MIN_SAMPLE_BYTES` sampled
    bytes not UTF-8 (a few bad bytes in a short text are text)."""
    return nul_bytes > 0 or (sampled >= MIN_SAMPLE_BYTES and replaced / sampled > BINARY_REPLACED_SHARE)


def sample_is_binary(sample: bytes) -> bool:
    """`looks_binary` of a sample of bytes (a NUL hole left by a copytruncate at its start is not counted)."""
    text = sample.lstrip(b"\0")
    if not text:
        return False
    # A multi-byte character cut at the sample's end is not an undecodable byte.
    decoded = text.decode("utf-8", "replace")
    return looks_binary(text.count(b"\0"), decoded.count("\ufffd"), len(text))


def binary_log(sample: bytes) -> bool:
    """The follower's refusal: `sample_is_binary`, and not one llama-server line in the sample."""
    if not sample_is_binary(sample):
        return False
    text = sample.decode("utf-8", "replace")
    return not specific(parse_lines(text.splitlines()[:-1] or [text]))


def understood(lines: int, recognized: bool, *, complete: bool = False) -> bool | None:
    """True once a llama-server line was read; False when `lines` held none and were enough to tell
    (`UNRECOGNIZED_AFTER_LINES`, or a `complete` file of at least one line); None while undecided."""
    if recognized:
        return True
    if lines >= UNRECOGNIZED_AFTER_LINES or (complete and lines > 0):
        return False
    return None


def not_understood(lines: int) -> str:
    """Why a log read as text is not llama-server's, in words."""
    return f"no llama-server log lines in {lines:,} lines ({EXPECTED})"


BINARY = "binary data, not a text log (expected llama-server's --log-file)"
