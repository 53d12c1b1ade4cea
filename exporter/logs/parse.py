"""Parse llama-server log lines into events. Pure: no I/O, no state, no clock.

A line is first normalised (`normalize`): JSONL wrapping (`--log-jsonl`), ANSI colour codes, the
router's `[ port] ` prefix, the `min.ss.mmm.uuu` elapsed timestamp and the `I/W/E/D` level letter are
removed. Then the message text is matched, never the 12-character function field, which changes
whenever upstream moves code. Every wording in `shared/reference/llama-server-logs.md` that feeds a
metric is accepted, from b3761 (`n_past`, `i =`) to b11434 (`n_tokens`, `off =`, `n_gen`).

Each rule (`exporter.logs.rules`) is a regex for the start of a message: the text after
`slot … | task N | ` for slot rules; for the others the text after the `srv  function: ` tag (or the
first `: ` of a b9829+ `cmn`/`que`/`spec` line), where a ` - ` bullet and a library line's
`function: ` may come first. All rules are
alternatives of one regex, and `parse_lines` runs it once over a whole batch of lines: the regex
engine skips the lines that carry no metric without any Python code running for them, and a match
names its rule (the group that closed last, `Match.lastindex`), so building the event is one call.
That is what lets the exporter read a large log several times faster than mtail. `parse_line` is the same
scan on one line.
Unknown lines give no event: most of a log is not interesting and that is not an error.

    >>> parse_line("0.00.064.202 E srv    send_error: task id = 24, error: Context size has been exceeded.")
    RequestError(task=24, reason='context_exceeded')
"""

from __future__ import annotations

import functools
import json
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TypeVar

from exporter.logs import events as ev
from exporter.logs.batch import joined
from exporter.logs.rules import ABORT_RULES, SLOT_RULES, TEXT_RULES

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Router prefix, elapsed timestamp, level letter. Whitespace classes exclude "\n": the scan runs over many lines.
# (`(?:x|)` rather than `(?:x)?`, ASCII classes, `[0-9][0-9]` rather than `\d{2}`: the same matches, found with
# fewer steps of Python's regex engine, on every line of a log.)
# The mark is not llama-server's: `unwrap_marked` puts it where it removed JSONL wrapping or colours.
_LEAD = (
    r"(?:[\udc1d\udc1e]|)(?:\[[^\S\n]*\d+\] |)(?:[0-9]+\.[0-9][0-9]\.[0-9][0-9][0-9]\.[0-9][0-9][0-9] |)(?:[IWEDT] |)"
)
_LEAD_RX = re.compile(_LEAD, re.ASCII)
# Python 3.11's possessive repeat (`x*+`) never gives back what it took, and costs no step of its own for what
# follows it (a plain repeat enters the rest of the pattern as a sub-match, on every line). The scan uses it
# only where giving back could not help: what follows cannot start with what the repeat takes, or the repeat
# ends an atomic group. Before 3.11 the plain repeat, the same matches.
_POSSESSIVE = "+" if sys.version_info >= (3, 11) else ""


def _fast_lead(p: str) -> str:
    """`_LEAD` for the scan: its rare mark and router tag as one alternation (the common line, without either,
    passes one empty alternative, not two), its repeats possessive (`p`: see `_POSSESSIVE`)."""
    router = rf"\[[^\S\n]*{p}\d+{p}\] "
    ts = rf"[0-9]+{p}\.[0-9][0-9]\.[0-9][0-9][0-9]\.[0-9][0-9][0-9] "
    return rf"(?:[\udc1d\udc1e](?:{router}|)|{router}|)(?:{ts}|)(?:[IWEDT] |)"


_LEAD_PARTS = re.compile(
    r"(?P<mark>[\udc1d\udc1e]|)(?:\[ *\d+\] |)(?P<ts>\d+\.\d{2}\.\d{3}\.\d{3} |)(?P<lvl>[IWEDT] |)"
)


# llama-server's own `--log-jsonl` shape, message last: the message is decoded without the rest of
# the object, 0.9 µs a line against 2.2 for json.loads, with the same result (a test holds it to that).
_JSONL_HEAD = re.compile(r'\{"type":"log","time":-?(?:0|[1-9]\d*),"level":"\w*","msg":"')
# json's own string decoder (C): (text, index after the opening quote) -> (value, index after the closing one).
_scanstring: Callable[[str, int], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]


def _jsonl_message(line: str) -> str | None:
    """The "msg" of a JSONL log entry, or None if the line is not a JSON object with a string "msg"."""
    m = _JSONL_HEAD.match(line)
    if m is not None:
        try:
            msg, end = _scanstring(line, m.end())
        except ValueError:
            pass
        else:
            if line[end:].strip(" \t\r\n") == "}":
                return msg
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    value: object = obj.get("msg") if isinstance(obj, dict) else None
    return value if isinstance(value, str) else None


# Lone surrogates: UTF-8 decoding (the tailer's, the journal's, standard input's) never yields one, so
# no line read from a log can start with a mark.
JSONL_MARK, COLOURS_MARK = "\udc1e", "\udc1d"


def unwrap_marked(line: str) -> str:
    """`unwrap`, with a mark in front of the line for what it removed (JSONL wrapping, colours in front).

    The scan reads the mark into the line's format (`LineFormat`), so that a raw line in a JSONL log, or
    a line without colours in a coloured one, can be told apart from the server's.
    """
    if line.startswith("{") and '"msg"' in line:
        msg = _jsonl_message(line)
        if msg is not None:
            msg = msg.split("\n", 1)[0]
            return JSONL_MARK + (ANSI.sub("", msg) if "\x1b" in msg else msg).rstrip("\r")
    if "\x1b" in line:
        mark = COLOURS_MARK if line.startswith("\x1b[") else ""
        return mark + ANSI.sub("", line).rstrip("\r\n")
    return line.rstrip("\r\n")


def unwrap(line: str) -> str:
    """The line without JSONL wrapping, colours and line ending (still with prefix, timestamp and level)."""
    line = unwrap_marked(line)
    return line[1:] if line[:1] in (JSONL_MARK, COLOURS_MARK) else line


def normalize(line: str) -> str:
    """Return the bare message of a log line: no JSONL wrapper, colours, router prefix, timestamp or level."""
    return _LEAD_RX.sub("", unwrap(line), count=1)


def _trie(words: Sequence[str]) -> str:
    """A regex for "one of `words` starts here", written as a tree on the words' letters: the regex engine
    skips an alternative by its first character without entering it, so a line is rejected after a
    handful of character comparisons instead of one per word. A word that another one starts with covers
    it (this is only ever a lookahead: what follows the shorter word is not read)."""
    heads: dict[str, list[str]] = {}
    for word in sorted(set(words)):
        heads.setdefault(word[0], []).append(word[1:])
    branches = []
    for first, tails in heads.items():
        if "" in tails:  # the one-letter word covers every longer word on this branch
            branches.append(re.escape(first))
        else:
            branches.append(re.escape(first) + _trie(tails))
    return branches[0] if len(branches) == 1 else f"(?:{'|'.join(branches)})"


def _class_end(rx: str, i: int) -> int:
    """Where the character class that opens at `rx[i]` ends (its "]"): its first character is a literal, even
    "]"; so is an escaped one."""
    i += 2 if rx[i + 1 : i + 2] == "^" else 1
    i += 2 if rx[i] == "\\" else 1
    while rx[i] != "]":
        i += 2 if rx[i] == "\\" else 1
    return i


def _structure(rx: str) -> Iterator[tuple[int, str, int]]:
    """`rx`'s characters outside escapes and character classes: (position, character, group depth after it)."""
    depth, i = 0, 0
    while i < len(rx):
        c = rx[i]
        if c == "\\":
            i += 1
        elif c == "[":
            i = _class_end(rx, i)
        else:
            depth += (c == "(") - (c == ")")
            yield i, c, depth
        i += 1


def closes_a_group(rx: str) -> bool:
    """Whether `rx`, whenever it matches, closes one of its own groups: a named group stands at its top level,
    neither optional nor repeated (`{…}` counts as optional), and no `|` does; and every group it has is named."""
    if re.compile(rx).groups != len(re.compile(rx).groupindex):
        return False
    found, named = False, False  # named: inside a named group opened at the top level
    for i, c, depth in _structure(rx):
        if c == "(":
            named = named or (depth == 1 and rx.startswith("(?P<", i))
        elif c == ")" and depth == 0 and named:
            found = found or rx[i + 1 : i + 2] not in ("?", "*", "{")
            named = False
        elif c == "|" and depth == 0:
            return False
    return found


def _marked(rx: str, name: str, every: bool) -> str:
    """The rule, and the empty group `name` after it, so that it closes last and `Match.lastgroup` names the
    rule; without `every`, left out where one of the rule's own groups always closes (`closes_a_group`): the
    last of them to close names it then (each group name is one rule's), and a match costs a step per group in
    the pattern (the match object's spans are made group by group)."""
    return rx if not every and closes_a_group(rx) else f"{rx}(?P<{name}>)"


def rule_names(rules: Sequence[tuple[str, str, object]], tag: str) -> list[list[str]]:
    """For each rule, the group names `Match.lastgroup` can give when it matched (see `_marked`)."""
    return [[f"{tag}{i}", *re.compile(rx).groupindex] for i, (_, rx, _) in enumerate(rules)]


def _starts_literal(rx: str) -> bool:
    """Whether `rx` starts with a literal character (a letter, digit or `_`, not repeated or optional): the
    regex engine's alternation skips such an alternative by comparing that one character."""
    return bool(re.match(r"\w(?![?*+{])", rx, re.ASCII)) and "|" not in _top_level(rx)


def _top_level(rx: str) -> str:
    """`rx` without what its groups and classes hold (for a look at its top-level `|`)."""
    return "".join(c for _, c, depth in _structure(rx) if depth == 0 and c != ")")


def _alternatives(rules: Sequence[tuple[str, str, object]], tag: str, anchored: bool = True) -> str:
    """`(?=words)(?:(?=[f])rule0(?P<tag0>)|(?=[f])rule1(?P<tag1>)|…)`.

    The rules' anchors, read from the rule table: the lookahead on all the rules' leading words (`_trie`)
    rejects most lines after a character or two, before any rule is tried; a rule is then entered only
    when the message starts with the first letter of one of its own words (`[f]`). Without `anchored`,
    the bare alternatives, each with its empty group: the same matches, found slower (the reference a test
    compares the scan with). `Match.lastgroup` names the rule that matched (`_marked`).
    """
    if not anchored:
        return "(?:" + "|".join(_marked(rx, f"{tag}{i}", True) for i, (_, rx, _) in enumerate(rules)) + ")"
    words = [word for words, _, _ in rules for word in words.split()]
    # Neighbours with the same first letters share one look at them (the rules' order is kept). A rule that
    # starts with a literal character needs no look: the regex engine passes it by at that character, without
    # entering it (a look is a step into a sub-match, for every rule it turns away).
    runs: list[tuple[str, list[str]]] = []
    for i, (ws, rx, _) in enumerate(rules):
        firsts = "" if _starts_literal(rx) else "".join(sorted({re.escape(w[0]) for w in ws.split()}))
        if not runs or runs[-1][0] != firsts or not firsts:
            runs.append((firsts, []))
        runs[-1][1].append(_marked(rx, f"{tag}{i}", False))
    rules_rx = "|".join(f"(?=[{firsts}])(?:{'|'.join(run)})" if firsts else run[0] for firsts, run in runs)
    return f"(?={_trie(words)})(?:{rules_rx})"


def _atomic(pattern: str, name: str) -> str:
    """`pattern`, matched once and never backtracked into: only for speed, the matches are the same."""
    if sys.version_info >= (3, 11):
        return f"(?>{pattern})"
    return f"(?=(?P<{name}>{pattern}))(?P={name})"  # the same, spelled with a lookahead and a back-reference


def _message(fast: bool = True) -> str:
    """One message: a slot line, or the text of any other line after its optional tag (`srv  function: `,
    or up to the first `: ` of a `cmn`/`que`/`spec` line) and a ` - ` bullet, then either a library line's
    `function: ` or not (`llama_context: n_ctx = …` and `build: 4747 (…)` are matched with their name).

    Without `fast`: no anchors and no atomic groups, the reference the scan is tested against (the same
    matches: everything `fast` adds only rejects sooner).
    """
    atomic = _atomic if fast else (lambda pattern, name: f"(?:{pattern})")
    p = _POSSESSIVE if fast else ""  # (where giving back could not help, see there)
    # The slot line's head is never backtracked into: past it only a word of a rule or the end of the line
    # can follow, neither a space, so no shorter split of it could match where this one failed.
    # (`slot ` outside it: a line that does not start so is passed over without entering the group. The
    # `print_timing` function is told by its first letter, not by a look ahead on every slot line.)
    slot_head = "slot " + atomic(
        rf"[^\S\n]{{0,11}}{p}(?:print_timing(?P<timing_fn>)|\S{{1,12}}): "
        rf"id[^\S\n]+{p}(?P<slot>\d+{p}) \| task (?P<task>-?{p}\d+{p}) \| *{p}",
        "slot_head",
    )
    # A `cmn`/`que`/`spec` tag runs to the first `: ` (the unrolled loop is the fast spelling).
    other_tag = rf"[^:\n]*{p}(?::(?! )[^:\n]*{p})*: " if fast else r"(?:[^:\n]|:(?! ))*: "
    # Spaces, a `-` bullet, spaces (` *-? *`), only ever at the end of an atomic group: possessive, or (before
    # 3.11) spelled as alternatives that start with their character, passed by at one look when the line has none.
    bullet = (rf" *{p}-?{p} *{p}" if p else r"(?: (?: *)|)(?:-|)(?: (?: *)|)") if fast else r" *-? *"
    return (
        "(?:"
        + slot_head
        # A slot line with no message from `print_timings`: the head of a pre-b9230 timings entry. The message
        # is empty, so the function field is all that tells it from other such lines (`slot reset:` at -v).
        + "(?:(?(timing_fn)(?P<timings_head>)$|(?!))|"
        + _alternatives(SLOT_RULES, "s", fast)
        + ")|"
        # A line that starts so and failed the slot branch fails the rest too (no other rule's word is "slot"):
        # said here, it leaves at once rather than after every tag and function alternative.
        + ("(?!slot )" if fast else "")
        + "(?:"
        + "".join(f"{rx}(?P<abort{i}>)|" for i, (rx, _) in enumerate(ABORT_RULES))
        + atomic(
            rf"(?:srv [^\S\n]*{p}\S{{1,12}}: |"
            + "".join(f"{t} {other_tag}|" for t in ("cmn", "que", "spec"))
            + ")"
            + bullet,
            "tag",
        )
        # (`(?:x|)`, not `(?:x)?`: an optional group is a repeat, with steps of its own on every line.)
        + "(?:"
        # (Possessive, the function field needs no atomic group of its own.)
        + (
            rf"\w+{p}: +{p}-?{p} *{p}"
            if p
            else atomic(r"\w+: +" + (r"(?:-|)(?: (?: *)|)" if fast else "-? *"), "function")
        )
        + "|)"
        + _alternatives(TEXT_RULES, "t", fast)
        + "))"
    )


def compile_scan(fast: bool = True) -> re.Pattern[str]:
    """The scan over lines, each after a "\\n": its lead (group 1), then `_message` (`fast=False`: the
    reference without anchors, see there)."""
    lead = _atomic(_fast_lead(_POSSESSIVE), "lead_") if fast else f"(?:{_LEAD})"
    return re.compile(r"\n(?P<lead>" + lead + ")" + _message(fast), re.MULTILINE | re.ASCII)


_MESSAGE = _message()
# Lines start after "\n": a literal first character lets the regex engine jump from line to line in C.
_SCAN_LINES = compile_scan()
_B = TypeVar("_B")
_TextBuild = Callable[[re.Match[str]], ev.Event]
_SlotBuild = Callable[[int, int, re.Match[str]], ev.Event]
# Each rule's build, under every name `Match.lastgroup` can give for it.
_SLOT_BUILDS: dict[str, _SlotBuild] = {
    name: build for (_, _, build), names in zip(SLOT_RULES, rule_names(SLOT_RULES, "s"), strict=True) for name in names
}
_SLOT_BUILDS["timings_head"] = lambda s, t, m: ev.TimingsHead(s, t)
_TEXT_BUILDS: dict[str, _TextBuild] = {
    name: build for (_, _, build), names in zip(TEXT_RULES, rule_names(TEXT_RULES, "t"), strict=True) for name in names
}
_TEXT_BUILDS.update((f"abort{i}", build) for i, (_, build) in enumerate(ABORT_RULES))


def _by_index(builds: Mapping[str, _B], scan: re.Pattern[str], other: _B) -> list[_B]:
    """`builds` by the number of the group each name is in `scan` (what `Match.lastindex` gives), `other` where no
    rule of theirs ends: a list index costs less than the hash of the name `Match.lastgroup` would give."""
    out = [other] * (scan.groups + 1)
    for name, build in builds.items():
        if name in scan.groupindex:  # (a rule's marker is left out where one of its own groups closes last)
            out[scan.groupindex[name]] = build
    return out


def _no_rule(slot: int, task: int, m: re.Match[str]) -> ev.Event:
    raise LookupError(f"no rule ends at group {m.lastindex} of the scan")  # cannot happen: every match ends one


# The build tables of each scan `_events` was given, by the scan's identity (the scan kept beside them, so that
# its id is never another's): a Pattern's hash reads its whole compiled code, 10 µs for the scan, on every call.
_KEPT: dict[int, tuple[re.Pattern[str], list[_TextBuild | None], list[_SlotBuild]]] = {}


def _builds(scan: re.Pattern[str]) -> tuple[list[_TextBuild | None], list[_SlotBuild]]:
    """The text rules' builds by the group number that ends each rule in `scan` (None: a slot rule's), and the
    slot rules' builds."""
    kept = _KEPT.get(id(scan))
    if kept is None or kept[0] is not scan:
        if len(_KEPT) >= 8:  # (the module's two scans, and the tests' reference ones)
            _KEPT.clear()
        kept = _KEPT[id(scan)] = (scan, _by_index(_TEXT_BUILDS, scan, None), _by_index(_SLOT_BUILDS, scan, _no_rule))
    return kept[1], kept[2]


# Slot ids as text, to their value: a lookup costs a third of int() on a fresh string, and a slot line's id is
# nearly always one of these (any other is read by int(), the same value).
_SLOT_IDS = {str(i): i for i in range(256)}

# A batch's slot lines name the same few tasks again and again (a task's prompt, progress, checkpoints, timings
# and release; `-1` between tasks): the scan reads each task id once a batch, and looks the others up.

# What building an event from a matched line can raise: int() of more digits than Python reads (4,300 by
# default), float() of "1.2.3". The line is then rejected, never the batch it came in.
_UNREADABLE = (ValueError, OverflowError)


def _line_format(lead: str) -> int:
    """The `LineFormat` code of a line's lead (what the scan read before the message; colours count
    only with a prefix)."""
    m = _LEAD_PARTS.match(lead)
    if m is None:  # cannot happen: the scan matched the same pattern
        return 0
    mark, ts, level = m.group("mark", "ts", "lvl")
    code = (ev.LineFormat.TIMESTAMP if ts else 0) | (ev.LineFormat.LEVEL if level else 0)
    if mark == JSONL_MARK:
        return code | ev.LineFormat.JSONL
    if mark and code:
        return code | ev.LineFormat.COLOURS
    return code


class RoutedLine(Exception):
    """A line that carries an event has a router child's `[PORT] ` tag: the batch is the router's, to be split."""


def _events(text: str, scan: re.Pattern[str], formats: bool = True, unrouted: bool = False) -> list[ev.Event]:
    """The events of the lines in `text`, each line preceded by "\\n"; with `formats`, a `LineFormat`
    before the first event and before each event whose line is written differently from the last one's.
    With `unrouted` (and `formats`), `RoutedLine` at the first event whose line has a router child's tag.

    The hot path of every line the exporter reads, written out in one loop: a call per event costs 5-10 %
    of it (measured on the bench corpus). A `try` costs nothing until it catches. The rule that matched is
    the group that closed last (`Match.lastindex`, see `_marked`): a text rule's build gets the match, a slot
    rule's the slot and task ids too.
    """
    events: list[ev.Event] = []
    append = events.append
    text_builds, slot_builds = _builds(scan)
    last, lead_len, lead_first = -1, -1, ""
    tasks: dict[str, int] = {}  # the batch's task ids as text, to their value
    for m in scan.finditer(text):
        if formats:
            # A lead of the same length and first character as the last one is taken as written the same
            # way (its time stamp differs): the format is worked out only when that changes. Not exact
            # (`200.00.001.689 ` passes after `2.00.001.689 I `), and need not be: the format tells lines
            # written differently by accident, and a line written on purpose can copy the lead exactly;
            # exact keys cost 4 % of a line (measured), for nothing a forgery could not get anyway.
            # The lead starts after the match's "\n" (two calls cost less than `span(1)`'s tuple).
            start, end = m.start() + 1, m.end(1)
            if end - start != lead_len or text[start] != lead_first:
                lead_len, lead_first = end - start, text[start]
                if lead_first == "[" and unrouted:  # (a lead starts so only with a router's tag)
                    raise RoutedLine
                code = _line_format(text[start:end])
                if code != last:
                    append(ev.LineFormat(code))
                    last = code
        i = m.lastindex or 0
        try:
            build = text_builds[i]
            if build is not None:
                append(build(m))
            else:
                slot, task_text = _SLOT_IDS.get(m["slot"]), m["task"]
                task = tasks.get(task_text)
                if slot is None:
                    slot = int(m["slot"])
                if task is None:
                    task = tasks[task_text] = int(task_text)
                append(slot_builds[i](slot, task, m))
        except _UNREADABLE:
            append(ev.Rejected("malformed"))
    return events


def scan_events(text: str, scan: re.Pattern[str]) -> list[ev.Event]:
    """The events `scan` (one of `compile_scan`'s) finds in `text`, lines each after a "\\n", with their formats."""
    return _events(text, scan)


def find_line_start(text: str, char: str, start: int = 1) -> int:
    """The index of the first `char` at or after `start` (at least 1) that begins a line of `text` (lines after
    "\\n"), or -1: `text.find("\\n" + char, start - 1) + 1`, but -1. A rare character (`[`, `{`) is found by a
    memchr and its line start checked, several times cheaper than that search, which stops at every line; past
    one for every 256 characters searched, the rest is searched that way (at most about a third more)."""
    i, hits = text.find(char, start), 0
    while i >= 0 and text[i - 1] != "\n":
        hits += 1
        if hits > 64 + ((i - start) >> 8):
            i = text.find("\n" + char, i)
            return i + 1 if i >= 0 else -1
        i = text.find(char, i + 1)
    return i


def is_plain(text: str) -> bool:
    """No line in `text` needs `unwrap_marked`: no JSONL, colours or CR."""
    return not ("\x1b" in text or "\r" in text or find_line_start(text, "{") >= 0)


def parse_lines(lines: Sequence[str]) -> list[ev.Event]:
    """The events of many raw log lines, in order (one line gives at most one event, after its `LineFormat`).

    The same events as `parse_line` on each line, at a fraction of the cost: plain text is scanned as
    one string; only a batch with JSONL, colours or CRLF line ends is unwrapped line by line first.
    """
    return parse_joined(joined(lines), lines)


def parse_joined(text: str, lines: Sequence[str], unrouted: bool = False) -> list[ev.Event]:
    """`parse_lines` for a caller that has joined the lines already: `text` is "\n" + "\n".join(lines). With
    `unrouted`, `RoutedLine` where a line that carries an event has a router child's tag (see `_events`)."""
    if not is_plain(text):  # only the lines that need it are unwrapped (the others lose a line end, if any)
        text = "\n" + "\n".join([unwrap_marked(x) if x[:1] == "{" or "\x1b" in x else x.rstrip("\r\n") for x in lines])
    return _events(text, _SCAN_LINES, unrouted=unrouted)


def parse_text_indexed(text: str) -> list[tuple[int, int, ev.Event]]:
    """The events of `text`, lines separated by "\\n", each with the index of its line and the
    offset in `text` where that line starts.

    For callers that need to know which line an event came from (`diagnose`). The lines must be
    plain (see `is_plain`) or already passed through `unwrap_marked`.
    """
    scan = "\n" + text
    out: list[tuple[int, int, ev.Event]] = []
    index, counted_to, last = 0, 0, -1
    lead_len, lead_first = -1, ""
    tasks: dict[str, int] = {}  # as in `_events`
    text_builds, slot_builds = _builds(_SCAN_LINES)
    # `_events`' loop again, with the line of each event (the hot path of `diagnose`).
    for m in _SCAN_LINES.finditer(scan):
        start = m.start()  # this line's "\n" in `scan`, i.e. where the line starts in `text`
        index += scan.count("\n", counted_to, start)  # newlines before this line's own "\n"
        counted_to = start
        lead_start, lead_end = start + 1, m.end(1)  # (as in `_events`)
        if lead_end - lead_start != lead_len or scan[lead_start] != lead_first:
            lead_len, lead_first = lead_end - lead_start, scan[lead_start]
            code = _line_format(scan[lead_start:lead_end])
            if code != last:
                out.append((index, start, ev.LineFormat(code)))
                last = code
        i = m.lastindex or 0
        try:
            build = text_builds[i]
            if build is not None:
                e = build(m)
            else:
                slot, task_text = _SLOT_IDS.get(m["slot"]), m["task"]
                task = tasks.get(task_text)
                if slot is None:
                    slot = int(m["slot"])
                if task is None:
                    task = tasks[task_text] = int(task_text)
                e = slot_builds[i](slot, task, m)
        except _UNREADABLE:
            e = ev.Rejected("malformed")
        out.append((index, start, e))
    return out


@functools.cache
def _scan_messages() -> re.Pattern[str]:
    """The scan for messages without their lead: compiled on first use (only tests parse bare messages)."""
    return re.compile(r"\n" + _MESSAGE, re.MULTILINE | re.ASCII)


def parse_message(msg: str) -> ev.Event | None:
    """Parse a normalised message (see `normalize`)."""
    events = _events("\n" + msg, _scan_messages(), formats=False)
    return events[0] if events else None


def parse_line_events(line: str) -> list[ev.Event]:
    """The events of one raw line: none, or its `LineFormat` and its event."""
    return _events("\n" + unwrap_marked(line), _SCAN_LINES)


def parse_line(line: str) -> ev.Event | None:
    """Parse one raw log line (any era, any prefix/colour/JSONL form) into an event, or None."""
    events = _events("\n" + unwrap_marked(line), _SCAN_LINES, formats=False)
    return events[0] if events else None
