"""The scan's anchors change no event: every rule on every line of every capture, with and without them.

The scan (`exporter.logs.parse`) rejects a line before trying any rule when its message cannot start
with a rule's leading word (the anchors, read from the rule table), and never backtracks into a line's
lead, slot head, tag or function. The reference is the same rule table joined without any of that
(`compile_scan(fast=False)`), each rule with the empty group that names it (the scan leaves that group out
where one of the rule's own groups always closes, and the last of them to close names the rule): each match,
its span, the rule it names and every group it read must be the same, over the captures of every build and library in tests/fixtures, the demo logs shipped in
exporter/data, and the hostile corpus (poison lines and seeded mutations of the captured lines).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from pathlib import Path

import pytest
from hostile_lines import POISON, mutate
from paths import FIXTURES, REPO

from exporter.logs import parse
from exporter.logs.rules import SLOT_RULES, TEXT_RULES

#: Every log capture: each build's and library's runs, the router, foreign logs, the demo logs.
CAPTURES = sorted(
    [p for p in FIXTURES.rglob("*") if p.is_file() and p.suffix in (".log", ".jsonl", ".txt")]
    + [p for p in FIXTURES.rglob("*") if p.is_file() and p.parent.name == "foreign"]
    + sorted((REPO / "exporter" / "data").glob("*.log"))
)


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8", errors="surrogateescape").splitlines()


def _scanned(text: str) -> list[str]:
    """Every line of `text` as the scan reads it (unwrapped where it must be), one scan text."""
    return ["\n" + "\n".join(parse.unwrap_marked(line) for line in text.split("\n"))]


#: Each group name a match can end on, to the rule it names ("s3": SLOT_RULES[3]); the other names, to themselves.
RULE_OF = {
    name: names[0]
    for rules, tag in ((SLOT_RULES, "s"), (TEXT_RULES, "t"))
    for names in parse.rule_names(rules, tag)
    for name in names
}
#: The empty groups that name a rule (not the rule's reading of the line).
MARKERS = {names[0] for rules, tag in ((SLOT_RULES, "s"), (TEXT_RULES, "t")) for names in parse.rule_names(rules, tag)}


def _matches(scan: re.Pattern[str], text: str) -> list[tuple[tuple[int, int], str | None, dict[str, str | None]]]:
    """Each match: its span, the rule it names, the groups it read."""
    return [
        (
            m.span(),
            RULE_OF.get(m.lastgroup or "", m.lastgroup),
            {k: v for k, v in m.groupdict().items() if k not in MARKERS},
        )
        for m in scan.finditer(text)
    ]


def test_a_rule_without_its_empty_group_is_still_named() -> None:
    """Most rules leave their empty group out of the scan: fewer groups, cheaper matches."""
    assert FAST.groups < REFERENCE.groups - 40
    assert all(name.startswith(("s", "t")) for name in MARKERS) and len(set(RULE_OF)) == len(RULE_OF)


FAST, REFERENCE = parse.compile_scan(), parse.compile_scan(fast=False)


def test_the_captures_are_found() -> None:
    names = {p.relative_to(FIXTURES).parts[0] for p in CAPTURES if p.is_relative_to(FIXTURES)}
    assert {"b9093", "b10306", "b11434", "router", "foreign", "llama-cpp-python-0.3.16"} <= names
    assert any(p.parent.name == "data" for p in CAPTURES)  # the demo logs


@pytest.mark.parametrize("path", CAPTURES, ids=[str(p.relative_to(REPO)) for p in CAPTURES])
def test_every_rule_on_every_captured_line_matches_the_same(path: Path) -> None:
    (text,) = _scanned("\n".join(_lines(path)))
    fast = _matches(FAST, text)
    assert fast == _matches(REFERENCE, text)
    # and the events built from them (with each line's format) are the same too
    assert parse.scan_events(text, FAST) == parse.scan_events(text, REFERENCE)


def test_every_rule_on_the_hostile_corpus_matches_the_same() -> None:
    rng = random.Random(48)
    lines = [line for line, _ in POISON]
    for path in CAPTURES:
        for line in _lines(path):
            mutated = line
            for _ in range(rng.randrange(1, 4)):
                mutated = mutate(rng, mutated)
            lines.append(mutated)
    (text,) = _scanned("\n".join(lines))
    fast = _matches(FAST, text)
    assert len(fast) > 1000  # the mutations leave most matching lines matching
    assert fast == _matches(REFERENCE, text)
    assert parse.scan_events(text, FAST) == parse.scan_events(text, REFERENCE)


@pytest.mark.parametrize(
    ("rx", "closes"),
    [
        (r"a(?P<x>b)", True),
        (r"(?:a|b)(?P<x>c)", True),
        (r"(?P<x>a|b)", True),
        (r"\((?P<x>b)", True),
        (r"[^\]|(](?P<x>b)", True),  # "|" and "(" in a class, after an escaped "]"
        (r"[]|](?P<x>b)", True),  # a "]" first in a class is a literal
        (r"(?P<x>[)|])c", True),
        (r"a(?P<x>b)?", False),
        (r"(?P<x>b){0,1}", False),
        (r"x|(?P<x>b)", False),
        (r"[\]](?P<x>a)|b", False),
        (r"((?P<x>b))", False),  # not at the top level: not looked into
        (r"(?P<x>b)(c)", False),  # an unnamed group could close last
        (r"no group", False),
    ],
)
def test_which_rules_name_themselves(rx: str, closes: bool) -> None:
    """A rule loses its empty group only where one of its own named groups closes whenever it matches."""
    assert parse.closes_a_group(rx) is closes


def _kin(rules: Sequence[tuple[str, str, object]]) -> list[int]:
    """Each rule's family: the first rule it is joined to by leading words, one of which starts with the other."""
    family = list(range(len(rules)))
    for i, (words, _, _) in enumerate(rules):
        for j in range(i):
            if any(a.startswith(b) or b.startswith(a) for a in words.split() for b in rules[j][0].split()):
                old, new = family[i], family[j]
                family = [new if f == old else f for f in family]
    return family


def test_the_order_of_the_slot_rules_changes_no_match_but_within_a_word(monkeypatch: pytest.MonkeyPatch) -> None:
    """The slot rules stand in the order that makes the scan cheapest (the lines a busy server writes most,
    first). That is free only where rules share no leading word: the scan with the families of rules in
    reverse order (a family's rules, such as the `prompt processing` forms, in their own order) matches every
    line of every capture and of the hostile corpus the same way, naming the same rule."""
    family = _kin(SLOT_RULES)
    firsts = sorted(set(family), reverse=True)
    order = [i for f in firsts for i in range(len(SLOT_RULES)) if family[i] == f]
    assert len(firsts) > 10 and order != list(range(len(SLOT_RULES)))
    monkeypatch.setattr(parse, "SLOT_RULES", [SLOT_RULES[i] for i in order])
    moved = parse.compile_scan()
    monkeypatch.undo()

    def rule(name: str | None) -> str | None:  # the moved scan's `s{k}` is the table's `s{order[k]}`
        if name is not None and re.fullmatch(r"s\d+", name):
            return f"s{order[int(name[1:])]}"
        return RULE_OF.get(name or "", name)

    rng = random.Random(7)
    lines = [line for line, _ in POISON]
    for path in CAPTURES:
        lines += _lines(path)
        lines += [mutate(rng, line) for line in _lines(path)]
    (text,) = _scanned("\n".join(lines))
    fast = _matches(FAST, text)
    assert len({name for _, name, _ in fast if name and name.startswith("s")}) > 15  # most slot rules are met
    assert [
        (m.span(), rule(m.lastgroup), {k: v for k, v in m.groupdict().items() if k not in MARKERS})
        for m in moved.finditer(text)
    ] == fast
