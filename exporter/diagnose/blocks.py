"""A block of log text as `diagnose` feeds it (see `Diagnoser.feed_text`): its lines, where the odd ones are
(those that need unwrapping or carry a router prefix), and what the scan reads of them, unwrapped in bulk."""

from __future__ import annotations

import re
from collections.abc import Sequence

from exporter.logs.parse import ANSI, COLOURS_MARK, find_line_start, unwrap_marked

# Whole lines that `_feed_plain` cannot take (see `odd_spans`), one after the other.
_ODD_LINES = re.compile(r"(?:(?:[\[{][^\n]*|[^\n\x1b\r]*[\x1b\r][^\n]*)\n)*")


def unwrapped(text: str, lines: Sequence[str]) -> str:
    """What the scan reads of `lines` (whole lines, none with a router prefix; `text` is their join): each
    line through `unwrap_marked` where it needs it (JSONL, colours), else without its line end, joined by
    "\\n". Coloured lines in bulk: one regex over the block rather than a call per line (an ANSI code never
    spans lines), each line coloured from its start marked first, as `unwrap_marked` marks it."""
    body = text[:-1] if text[-1:] == "\n" else text
    if "\r" in body or body[:1] == "{" or "\n{" in body:
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
