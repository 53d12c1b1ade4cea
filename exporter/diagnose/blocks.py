"""A block of log text as `diagnose` feeds it (see `Diagnoser.feed_text`): its lines, where the odd ones are
(those that need unwrapping or carry a router prefix), and what the scan reads of them, unwrapped in bulk."""

from __future__ import annotations

import re
from collections.abc import Sequence
from itertools import chain, repeat

from exporter.logs.parse import ANSI, COLOURS_MARK, JSONL_MARK, find_line_start, unwrap_marked

# A `--log-jsonl` entry as llama-server writes it whose message's first line holds no escape or control character:
# that line is the text between the quote and the first "\\n" escape, what `unwrap_marked` keeps of it (the rest,
# valid JSON, is dropped as it drops it; a test holds the two to the same result).
_PLAIN_JSONL = re.compile(
    r'^\{"type":"log","time":-?(?:0|[1-9][0-9]*),"level":"[a-z]*","msg":"([^"\\\x00-\x1f]*)'
    r'(?:\\n(?:[^"\\\x00-\x1f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*|)"\}$',
    re.MULTILINE,
)
# Whole lines that `_feed_plain` cannot take (see `odd_spans`), one after the other.
_ODD_LINES = re.compile(r"(?:(?:[\[{][^\n]*|[^\n\x1b\r]*[\x1b\r][^\n]*)\n)*")


def unwrapped(text: str, lines: Sequence[str]) -> str:
    """What the scan reads of `lines` (whole lines, none with a router prefix; `text` is their join): each
    line through `unwrap_marked` where it needs it (JSONL, colours), else without its line end, joined by
    "\\n". JSONL entries and coloured lines in bulk: a regex over the block rather than a call per line (an
    entry is one line, an ANSI code never spans lines), each line coloured from its start marked first, as
    `unwrap_marked` marks it."""
    body = text[:-1] if text[-1:] == "\n" else text
    if "\r" in body or body[:1] == "{" or find_line_start(body, "{") >= 0:
        if "\r" not in body and "\x1b" not in body:
            # llama-server's own JSONL entries whose message needs no decoding, unwrapped by one regex; what
            # is left (escapes, other shapes) line by line. The lines have no line end to strip.
            parts = _PLAIN_JSONL.split(body)  # the text between those entries, and each one's first line
            # (not `sub` with "\\1": before 3.12, Python code expands the template, a call per entry)
            body = "".join(chain.from_iterable(zip(parts[0::2], repeat(JSONL_MARK), parts[1::2]))) + parts[-1]
            if body[:1] != "{" and find_line_start(body, "{") < 0:
                return body
            return "\n".join([unwrap_marked(x) if x[:1] == "{" else x for x in body.split("\n")])
        return "\n".join([unwrap_marked(x) if x[:1] == "{" or "\x1b" in x else x.rstrip("\r\n") for x in lines])
    if body[:2] == "\x1b[":
        body = COLOURS_MARK + body
    return ANSI.sub("", body.replace("\n\x1b[", "\n" + COLOURS_MARK + "\x1b["))


def _past_odd_lines(text: str, pos: int) -> int:
    """Where the odd whole lines (see `odd_spans`) that start at `pos` end (`pos` where none does)."""
    m = _ODD_LINES.match(text, pos)
    return m.end() if m is not None else pos


def lines_of(text: str) -> list[str]:
    """`text` split after each "\\n" only (str.splitlines also splits at \\r, \\x1c, U+2028 ...)."""
    parts = text.split("\n")
    last = parts.pop()
    lines = [part + "\n" for part in parts]
    if last:
        lines.append(last)
    return lines


def odd_spans(text: str) -> list[tuple[int, int]]:
    """Where the lines of `text` are that `_feed_plain` cannot take: those that need unwrapping (JSONL,
    colours, CR: see is_plain) or carry a router prefix ("[port] "), and a last line without its "\\n".
    As [start, end) offsets, neighbours joined, in order. Found by searching for what makes a line odd,
    so the cost is in the odd lines (rare in most logs), not in every line; the odd lines that follow one
    (a JSONL or coloured log is odd throughout) are taken by one regex match, not one search each."""
    spans: list[tuple[int, int]] = []
    size = len(text)
    for char in ("\x1b", "\r"):  # anywhere in a line
        i = text.find(char)
        while i >= 0:
            end = text.find("\n", i) + 1 or size
            end = _past_odd_lines(text, end)
            spans.append((text.rfind("\n", 0, i) + 1, end))
            i = text.find(char, end) if end < size else -1
    for char in "[{":  # at the start of a line
        end = (text.find("\n") + 1 or size) if text[:1] == char else 0
        if end:
            end = _past_odd_lines(text, end)
            spans.append((0, end))
        i = find_line_start(text, char, max(end, 1))
        while i >= 0:
            end = _past_odd_lines(text, text.find("\n", i) + 1 or size)
            spans.append((i, end))
            i = find_line_start(text, char, end) if end < size else -1
    if text and text[-1] != "\n":
        spans.append((text.rfind("\n") + 1, size))
    if len(spans) < 2:
        return spans
    spans.sort()
    merged = [spans[0]]
    for start, end in spans[1:]:
        last_start, last_end = merged[-1]
        if start <= last_end:
            if end > last_end:
                merged[-1] = (last_start, end)
        else:
            merged.append((start, end))
    return merged
