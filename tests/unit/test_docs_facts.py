"""Docs that cannot drift: what the prose says about the alerts, the recording rules and the metrics is read
from the facts beside it (alerts/llamacpp-rules.yml, the exporter's collectors), never written in the test.

- A sentence that gives an alert a duration (`for 5 min`, `after 30 s`, `kept 15 min`) or a severity
  (`(critical)`) says what the rule's `for:`, `keep_firing_for:` and `severity` say; an alert with no
  `for:` is said to fire at once, not "for 30 s". The runbook's `**Severity: …**` line of each alert too.
- Every recording rule a page or a config names (`instance:…:…`) is in the rules.
- Every metric family the exporter and the guard expose is in the metrics reference (README's Metrics,
  docs/metrics.md, docs/guard.md), and every family named there exists.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest
import yaml
from paths import FIXTURES, REPO

RULES_FILE = REPO / "alerts" / "llamacpp-rules.yml"
PAGES = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md"), REPO / "alerts" / "runbook.md"])
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
ALERT = re.compile(r"\bLlamaCpp[A-Z]\w+")
#: A duration given to an alert: "for 30 s", "after 5 min", "kept 15 min", "for: 10m".
DURATION = re.compile(
    r"\b(?P<verb>for:?|after|kept(?: firing)?(?: for)?|keep_firing_for:?|stays? up for) (?P<n>\d+(?:\.\d+)?) ?"
    r"(?P<unit>s|sec|seconds?|m|min|minutes?|h|hours?)\b"
)
UNIT_SECONDS = {"s": 1, "sec": 1, "second": 1, "seconds": 1, "m": 60, "min": 60, "minute": 60, "minutes": 60}
UNIT_SECONDS |= {"h": 3600, "hour": 3600, "hours": 3600}
#: A severity given to an alert right after its name: "`LlamaCppX` (warning)", "LlamaCppX (critical, the page)".
SEVERITY_AFTER = re.compile(r"^`?\)?\s*\((critical|warning|info)\b")


def _seconds(duration: str | None) -> int:
    """A Prometheus duration ("0s", "15m", "1h30m") in seconds; None is 0."""
    if not duration:
        return 0
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    return int(sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)", duration)))


@cache
def _rules() -> dict[str, dict[str, object]]:
    """Each alert's `for` and `keep_firing_for` (seconds) and severity, from the committed rules file."""
    doc = yaml.safe_load(RULES_FILE.read_text(encoding="utf-8"))
    return {
        r["alert"]: {
            "for": _seconds(r.get("for")),
            "keep": _seconds(r.get("keep_firing_for")),
            "severity": r["labels"]["severity"],
            "expr": r["expr"],
        }
        for g in doc["groups"]
        for r in g["rules"]
        if "alert" in r
    }


def _records() -> set[str]:
    doc = yaml.safe_load(RULES_FILE.read_text(encoding="utf-8"))
    return {r["record"] for g in doc["groups"] for r in g["rules"] if "record" in r}


def _sentences(text: str) -> list[str]:
    """Prose in sentences: paragraphs joined, split at a full stop; each table row and heading is one."""
    out: list[str] = []
    for block in re.split(r"\n\s*\n", FENCE.sub("", text)):
        lines = block.splitlines()
        if lines and all(line.lstrip().startswith("|") for line in lines):
            out.extend(lines)
            continue
        joined = " ".join(line.strip() for line in lines)
        out.extend(re.split(r"(?<=[.;])\s+(?=[A-Z`(*])|(?<=:)\s+(?=- )|\s+(?=- \*\*)", joined))
    return out


def duration_claims(text: str) -> list[tuple[str, str, str, int]]:
    """(alert, verb, words, seconds) for each duration a sentence gives the alert named nearest before it."""
    claims = []
    for sentence in _sentences(text):
        for m in DURATION.finditer(sentence):
            named = [a for a in ALERT.finditer(sentence) if a.end() <= m.start()]
            if not named:
                continue
            alert = named[-1].group(0)
            # Beyond the next clause the duration is the clause's own ("… for 5 min; requests for 30 s …").
            if ";" in sentence[named[-1].end() : m.start()]:
                continue
            seconds = int(float(m.group("n")) * UNIT_SECONDS[m.group("unit")])
            claims.append((alert, m.group("verb"), m.group(0), seconds))
    return claims


def severity_claims(text: str) -> list[tuple[str, str]]:
    """(alert, severity) for each alert name followed by its severity in brackets."""
    return [
        (m.group(0), s.group(1))
        for m in ALERT.finditer(FENCE.sub("", text))
        if (s := SEVERITY_AFTER.match(text[m.end() : m.end() + 40])) is not None
    ]


def _wrong_durations(text: str) -> list[str]:
    rules = _rules()
    wrong = []
    for alert, verb, words, seconds in duration_claims(text):
        if alert not in rules:
            continue
        key = "keep" if verb.startswith(("kept", "keep", "stay")) else "for"
        if seconds != rules[alert][key]:
            said = f"{rules[alert][key]} s" if rules[alert][key] else "no duration: it fires at once"
            wrong.append(f"{alert}: {words!r}, the rule's {key}: {said}")
    return wrong


def test_the_claims_are_read_from_sentences() -> None:
    """The reader finds a wrong duration and severity where a person would, and nothing in other clauses."""
    text = (
        "`LlamaCppKVPoolSaturated` (critical) pages when the pool is past 90% for 30 s.\n\n"
        "`LlamaCppServerDown` fires after 1 min and is kept 15 min; requests wait for 30 s.\n\n"
        "| `LlamaCppExporterDown` (warning) | for 5 min |"
    )
    assert duration_claims(text) == [
        ("LlamaCppKVPoolSaturated", "for", "for 30 s", 30),
        ("LlamaCppServerDown", "after", "after 1 min", 60),
        ("LlamaCppServerDown", "kept", "kept 15 min", 900),
        ("LlamaCppExporterDown", "for", "for 5 min", 300),
    ]
    assert severity_claims(text) == [("LlamaCppKVPoolSaturated", "critical"), ("LlamaCppExporterDown", "warning")]
    wrong = _wrong_durations(text)
    assert any(w.startswith("LlamaCppKVPoolSaturated: 'for 30 s'") for w in wrong), wrong


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_durations_and_severities_said_of_an_alert_are_the_rules(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    rules = _rules()
    wrong = _wrong_durations(text)
    wrong += [
        f"{alert}: said {said}, the rule's severity: {rules[alert]['severity']}"
        for alert, said in severity_claims(text)
        if alert in rules and said != rules[alert]["severity"]
    ]
    assert not wrong, wrong


def test_the_runbooks_severity_line_of_each_alert_is_the_rules() -> None:
    """`## Alert` then `**Severity: critical (pages at once; kept 15 min).** …, for 5 min.`: the rule's."""
    runbook = (REPO / "alerts" / "runbook.md").read_text(encoding="utf-8")
    rules = _rules()
    wrong, seen = [], 0
    for alert, body in re.findall(r"^## (LlamaCpp\w+)\n(.*?)(?=^## |\Z)", runbook, re.M | re.S):
        line = re.search(r"\*\*Severity: (\w+)(.*?)(?:\n\s*\n|\Z)", body, re.S)
        if alert not in rules or line is None:
            continue
        seen += 1
        if line.group(1) != rules[alert]["severity"]:
            wrong.append(f"{alert}: Severity: {line.group(1)}, the rule's: {rules[alert]['severity']}")
        paragraph = " ".join(line.group(0).split())
        for m in DURATION.finditer(paragraph):  # the section's paragraph speaks of its alert only
            key = "keep" if m.group("verb").startswith(("kept", "keep", "stay")) else "for"
            if int(float(m.group("n")) * UNIT_SECONDS[m.group("unit")]) != rules[alert][key]:
                wrong.append(f"{alert}: {m.group(0)!r}, the rule's {key}: {rules[alert][key]} s")
        at_once = re.search(r"\bat once\b", paragraph.split(".**")[0]) is not None
        if at_once and rules[alert]["for"]:
            wrong.append(f"{alert}: said to fire at once, the rule's for: {rules[alert]['for']} s")
    assert seen >= len(rules) - 1, f"{seen} severity lines read for {len(rules)} alerts"
    assert not wrong, wrong


def test_a_page_that_says_every_alert_links_says_when() -> None:
    """The committed rules carry no link (no placeholder reaches a pager): a sentence that says every alert
    links its runbook (or has `runbook_url`) says it is so once rendered with an address."""
    doc = yaml.safe_load(RULES_FILE.read_text(encoding="utf-8"))
    linked = any("runbook_url" in r.get("annotations", {}) for g in doc["groups"] for r in g["rules"])
    claims = re.compile(r"\bevery alert\b[^.]*?(?:\blinks?\b|runbook_url)", re.I)
    qualified = re.compile(
        r"rendered|no link|so that|\bonce\b|\bwith (?:your addresses|`?--runbook-url)|\bwithout\b", re.I
    )
    wrong = [
        f"{page.name}: {sentence[:160]}"
        for page in PAGES
        for sentence in _sentences(page.read_text(encoding="utf-8"))
        if not linked and claims.search(sentence) and not qualified.search(sentence)
    ]
    assert not wrong, wrong


#: A comparison a page quotes from a rule: "`… > 0.9`", "`… < 512 MiB`"; its operator and threshold.
COMPARISON = re.compile(r"(>=|<=|==|!=|>|<) ?(-?\d+(?:\.\d+)?)(?: ?(KiB|MiB|GiB))?\s*$")
PERCENT = re.compile(r"\b(\d+(?:\.\d+)?) ?%")


def _thresholds(expr: str) -> set[tuple[str, float]]:
    """The (operator, number) comparisons of a rule's expression."""
    return {(op, float(n)) for op, n in re.findall(r"(>=|<=|==|!=|>|<)\s*(-?\d+(?:\.\d+)?)(?![\w.])", expr)}


def wrong_thresholds(alert: str, text: str) -> list[str]:
    """The comparisons quoted in backticks in `text`, and the percentages it gives `alert`, that its rule lacks."""
    expr = str(_rules()[alert]["expr"])
    wrong = []
    for code in re.findall(r"`([^`]*)`", text):
        m = COMPARISON.search(code)
        if m is None:
            continue
        value = float(m.group(2)) * {None: 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}[m.group(3)]
        if (m.group(1), value) not in _thresholds(expr):
            wrong.append(f"{alert}: `{code}`, not in its rule")
    numbers = {n for _, n in _thresholds(expr)}
    for m in PERCENT.finditer(text):
        if float(m.group(1)) / 100 not in numbers:
            wrong.append(f"{alert}: {m.group(0)}, the rule compares with {sorted(numbers)}")
    return wrong


def test_the_threshold_reader_finds_a_changed_one() -> None:
    assert wrong_thresholds("LlamaCppKVPoolSaturated", "`llamacpp_kv_pool_active_ratio > 0.9`, past 90 %") == []
    assert len(wrong_thresholds("LlamaCppKVPoolSaturated", "`llamacpp_kv_pool_active_ratio > 0.8`, past 80 %")) == 2


def test_thresholds_said_of_an_alert_are_the_rules() -> None:
    """Each runbook section's severity paragraph quotes its rule's comparisons; a percentage a sentence gives
    an alert (nearest before it, in the same clause) is one its rule compares with."""
    rules = _rules()
    wrong = []
    runbook = (REPO / "alerts" / "runbook.md").read_text(encoding="utf-8")
    for alert, body in re.findall(r"^## (LlamaCpp\w+)\n(.*?)(?=^## |\Z)", runbook, re.M | re.S):
        line = re.search(r"\*\*Severity: (\w+)(.*?)(?:\n\s*\n|\Z)", body, re.S)
        if alert in rules and line is not None:
            wrong += [w for w in wrong_thresholds(alert, " ".join(line.group(0).split())) if "`" in w]
    for page in PAGES:
        for sentence in _sentences(page.read_text(encoding="utf-8")):
            for m in PERCENT.finditer(sentence):
                named = [a for a in ALERT.finditer(sentence) if a.end() <= m.start()]
                if named and named[-1].group(0) in rules and ";" not in sentence[named[-1].end() : m.start()]:
                    wrong += [f"{page.name}: {w}" for w in wrong_thresholds(named[-1].group(0), m.group(0))]
    assert not wrong, wrong


# --------------------------------------------------------------------------------- recording rules
#: A recording rule's name, `level:metric:operations` (Prometheus' naming convention).
RECORDING = re.compile(r"\b(?:instance|job|job_instance|server|model|cluster):llamacpp_\w+:\w+")
TEXT_FILES = sorted(
    {
        *PAGES,
        *REPO.glob("*.md"),
        REPO / ".env.example",
        *REPO.glob("docker-compose*.yml"),
        *(REPO / "deploy").rglob("*.yml"),
        *(REPO / "deploy").rglob("*.md"),
        *(REPO / "dashboards").glob("*.md"),
    }
)


@pytest.mark.parametrize("path", TEXT_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_recording_rule_named_is_in_the_rules(path: Path) -> None:
    named = set(RECORDING.findall(path.read_text(encoding="utf-8")))
    assert not named - _records(), f"{path.name} names recording rules that are not in the rules: {named - _records()}"


def test_the_recording_rule_reader_finds_names() -> None:
    assert RECORDING.findall("Recording rules: `job_instance:llamacpp_exporter_target:known` (gone)") == [
        "job_instance:llamacpp_exporter_target:known"
    ]
    assert "instance:llamacpp_slots_processing:sum" in _records()


# --------------------------------------------------------------------------------- metrics
#: Where a metric is documented: README's "Metrics" table, docs/metrics.md, the guard's and the router's pages.
REFERENCE = [REPO / "README.md", *(REPO / "docs" / n for n in ("metrics.md", "guard.md", "many-servers.md"))]
METRIC = re.compile(r"\bllamacpp_[a-z0-9_]+")
#: The suffixes a family's samples carry beyond its name.
SUFFIXES = ("", "_total", "_info", "_bucket", "_sum", "_count", "_created")


def exposed_families() -> set[str]:
    """Every metric family the exporter and the guard can expose: each name their collectors give
    (`llamacpp_gpu_memory_{kind}_bytes` expanded), read from the code, not listed here."""
    names: set[str] = set()
    for path in (REPO / "exporter").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        for call in re.finditer(r"\b(?!getLogger)\w+\(\s*f?\"(llamacpp_[^\"]+)\"", text):
            name = call.group(1)
            if "{kind}" in name:
                kinds = re.search(r"for kind[^\n]*in \(([^)]*)\)", text)
                assert kinds is not None, path
                names |= {name.replace("{kind}", k) for k in re.findall(r"\"(\w+)\"", kinds.group(1))}
            else:
                names.add(name)
    return names


def documented_names(text: str) -> set[str]:
    """Metric names in `text`, with the README's shorthand expanded: "`a_total_bytes` / `_used_bytes`"
    names `a_used_bytes` (the shorthand replaces some of the name's last words: each reading is taken)."""
    names: set[str] = set()
    for m in re.finditer(r"`(llamacpp_[a-z0-9_]+)[^`]*`((?:\s*/\s*`_[a-z0-9_]+[^`]*`)+)", text):
        words = m.group(1).split("_")
        for short in re.findall(r"`(_[a-z0-9_]+)", m.group(2)):
            names |= {"_".join(words[:keep]) + short for keep in range(2, len(words))}
    return names | set(METRIC.findall(text))


def _reference_names() -> set[str]:
    return set().union(*(documented_names(p.read_text(encoding="utf-8")) for p in REFERENCE))


def test_every_exposed_metric_is_documented() -> None:
    documented = _reference_names()
    exposed = exposed_families()
    assert len(exposed) >= 90, sorted(exposed)  # the reader found the collectors
    missing = sorted(n for n in exposed if not any(n + s in documented for s in SUFFIXES))
    assert not missing, f"exposed but documented nowhere in {[p.name for p in REFERENCE]}: {missing}"


def test_the_family_reader_sees_what_a_real_exposition_holds() -> None:
    """Every family in the recorded expositions (tests/fixtures/golden) is one the reader found in the code."""
    exposed = exposed_families()
    in_goldens = {
        m.group(1)
        for path in (FIXTURES / "golden").rglob("*.prom")
        for m in re.finditer(r"^# TYPE (\S+) ", path.read_text(encoding="utf-8"), re.M)
    }
    assert in_goldens and not {
        n for n in in_goldens if not {n, n.removesuffix("_total"), n.removesuffix("_info")} & exposed
    }


def test_the_shorthand_is_expanded() -> None:
    text = "| `llamacpp_gpu_memory_total_bytes` / `_used_bytes` / `_free_bytes{gpu}` | `llamacpp_x_lost_bytes_total` / `_long_lines_total` |"
    assert {"llamacpp_gpu_memory_used_bytes", "llamacpp_gpu_memory_free_bytes", "llamacpp_x_long_lines_total"} <= (
        documented_names(text)
    )
