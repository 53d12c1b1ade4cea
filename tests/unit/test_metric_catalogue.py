"""The metric catalogue (exporter/metrics/catalogue/) is what the exporter and the guard emit, and what the
rules, the dashboard and the docs name.

- Every collector, fed with the tests' states (tests/support/emitted.py: every log golden's capture, two
  servers on GPUs over the fake pynvml with their process found, the HTTP endpoints, a filling pool, the
  guard's books and its books by client), emits only catalogued families, each with the catalogue's type,
  help and labels, its bounded labels' values within their allowed sets, and the labels a scrape adds
  (`server`, `model`) only where its scope allows them; every catalogued family is emitted by some feeder.
- Every metric name in the alert rules, the dashboard JSON, the README, the docs, the runbook and the
  exporter's own messages and help is in the catalogue (recording rules, `instance:…:…`, are the rules' own), and every label value they give a
  bounded label is one it takes.
- Every catalogued family is documented: docs/metric-list.md lists each with its help (rendered from the
  catalogue), and the README's metric table, docs/metrics.md, docs/guard.md and docs/many-servers.md say
  more of those that need it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
from emitted import Emitted, emitted
from paths import REPO
from prometheus_client.core import HistogramMetricFamily, Metric

from exporter.logs import events as ev
from exporter.metrics.catalogue import BY_NAME, CATALOGUE
from exporter.metrics.catalogue.family import CLIENT, GUARD, HOST, ROUTER, SERVER, Family
from exporter.metrics.catalogue.server import EVENT_COUNTERS
from exporter.metrics.server_log import ServerLogCollector
from exporter.model.histogram import Histogram
from exporter.model.state import ServerState
from exporter.model.view import ServerView

#: Families the exporter serves that are not its own: client_python's process collector (`process_…`).
FOREIGN = re.compile(r"(process|python)_")
#: Catalogued families no feeder emits, each with why (none today: every family is fed).
NOT_FED: dict[str, str] = {}
#: The labels a scrape adds to a unit's series (`exporter.metrics.servers`), by scope.
UNIT_LABELS = {ROUTER: {"server"}, HOST: set(), GUARD: set(), CLIENT: set()}
ANY_UNIT_LABELS = {"server", "model", "exported_model"}
#: The labels a family's type adds to its samples.
TYPE_LABELS = {"histogram": {"le"}, "summary": {"quantile"}}

RULES = REPO / "alerts" / "llamacpp-rules.yml"
DASHBOARD = REPO / "dashboards" / "llamacpp.json"
#: Where a metric is documented: README's "Metrics" table, docs/metrics.md, the guard's and the router's pages,
#: and docs/metric-list.md, rendered from the catalogue (scripts/metric_list.py; test_generated_files.py holds
#: it current, so a family catalogued and not rendered there fails that test).
REFERENCE = [
    REPO / "README.md",
    *(REPO / "docs" / n for n in ("metrics.md", "guard.md", "many-servers.md", "metric-list.md")),
]
#: Every page that may name a metric: the README, the docs, the runbook.
PAGES = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md"), REPO / "alerts" / "runbook.md"])
#: Names that look like metrics but are not: the generators' packages (alerts/llamacpp_rules/, dashboards/…),
#: and the exporter's distribution and logger.
PACKAGES = {"llamacpp_rules", "llamacpp_dashboard", "llamacpp_exporter"}
#: A metric name, not a part of a recording rule's (`instance:llamacpp_x:sum`) nor of llama-server's own
#: (`llamacpp:requests_deferred`).
METRIC = re.compile(r"(?<![\w:])llamacpp_[a-z0-9_]*[a-z0-9](?![\w:*])")
#: Several names in one: `llamacpp_host_memory_{available,total}_bytes`.
BRACES = re.compile(r"(llamacpp_[a-z0-9_]*_)\{([a-z0-9_]+(?:,[a-z0-9_]+)+)\}([a-z0-9_]*)")
#: A prefix of names: `llamacpp_exporter_log_*`.
WILDCARD = re.compile(r"(?<![\w:])(llamacpp_[a-z0-9_]*)\*")
#: The suffixes a family's samples carry beyond its exposed name, by type.
SAMPLE_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Emitted:
    return emitted(tmp_path_factory.mktemp("fed"))


def _catalogued(metric: Metric) -> Family | None:
    """The catalogue's entry of an emitted family (prometheus_client names a counter without `_total`)."""
    suffix = {"counter": "_total", "info": "_info"}.get(metric.type, "")
    return BY_NAME.get(metric.name + suffix)


def wrong_emissions(fed: Emitted) -> Iterator[str]:
    """What the fed collectors emit that the catalogue does not say."""
    for feeder, metrics in fed.items():
        for m in metrics:
            if FOREIGN.match(m.name):
                continue
            entry = _catalogued(m)
            where = f"{feeder}: {m.name}"
            if entry is None:
                yield f"{where} ({m.type}) is emitted but not catalogued"
                continue
            if (m.type, m.documentation) != (entry.type, entry.help):
                yield f"{where}: emitted as {m.type} {m.documentation!r}, catalogued {entry.type} {entry.help!r}"
            unit = UNIT_LABELS.get(entry.scope, ANY_UNIT_LABELS)
            for s in m.samples:
                own = set(s.labels) - TYPE_LABELS.get(m.type, set())
                if own - unit - set(entry.labels) or not set(entry.labels) <= own:
                    yield f"{where}: labels {sorted(s.labels)}, catalogued {list(entry.labels)} (scope {entry.scope})"
                    break
                for label, allowed in entry.values.items():
                    if s.labels.get(label) not in allowed:
                        yield f"{where}: {label}={s.labels.get(label)!r} not in {allowed}"


def test_the_collectors_emit_only_what_the_catalogue_says(fed: Emitted) -> None:
    assert len(fed) > 50 and len(CATALOGUE) >= 100  # every golden and every other feeder ran
    assert list(wrong_emissions(fed)) == []


def test_every_catalogued_family_is_emitted(fed: Emitted) -> None:
    emitted_names = {e.name for metrics in fed.values() for m in metrics if (e := _catalogued(m)) is not None}
    assert sorted(set(BY_NAME) - emitted_names - set(NOT_FED)) == []
    assert not set(NOT_FED) & emitted_names, "fed now: take it off NOT_FED"


def test_names_are_one_each_and_counters_end_in_total() -> None:
    assert len(BY_NAME) == len(CATALOGUE)
    for f in CATALOGUE:
        assert f.name.startswith("llamacpp_"), f.name
        assert f.name.endswith("_total") == (f.type == "counter"), f.name
        assert f.name.endswith("_info") == (f.type == "info"), f.name
        assert set(f.values) <= set(f.labels), f.name


def test_every_counted_event_kind_has_one_server_counter() -> None:
    """A kind that declares `counted` is exported by exactly one unlabelled server counter naming it, and a
    counter names only such a kind: the state counts it whatever the family says."""
    named = [f.event for f in CATALOGUE if f.event is not None]
    assert sorted(k.__name__ for k in named) == sorted(k.__name__ for k in ev.COUNTED) != []
    for family, kind in EVENT_COUNTERS:
        assert (family.type, family.scope, family.labels) == ("counter", SERVER, ()), family.name
        assert kind in ev.COUNTED


def test_a_counted_kind_is_counted_without_a_handler_and_only_while_counting() -> None:
    """The generic count: every applied event of the kind counts once, one applied while the state
    replays (counting off) does not, and the scrape shows the count."""
    state = ServerState()
    state.apply(ev.SlotsInitialized(1))
    state.apply(ev.KVRetry(0, 512))
    state.counting = False
    state.apply(ev.KVRetry(0, 256))
    state.counting = True
    state.apply(ev.MemorySlotFailure(256))
    state.apply(ev.KVRetry(0, 128))
    assert (state.counted[ev.KVRetry], state.counted[ev.MemorySlotFailure]) == (2, 1)
    samples = {
        s.name: s.value
        for m in ServerLogCollector(lambda: ServerView(state)).collect()
        for s in m.samples
        if s.name in ("llamacpp_kv_retries_total", "llamacpp_kv_memory_slot_failures_total")
    }
    assert samples == {"llamacpp_kv_retries_total": 2, "llamacpp_kv_memory_slot_failures_total": 1}


@pytest.mark.parametrize("values", [(), ("full_reprocess",)])
def test_a_histogram_family_has_prometheus_clients_samples(values: tuple[str, ...]) -> None:
    """`Histograms.add` writes the samples `HistogramMetricFamily.add_metric` writes from `Histogram.buckets()`:
    equal values, label dicts and order, for an empty histogram and a filled one."""
    family = BY_NAME["llamacpp_time_to_first_token_seconds"]
    labels = family.labels if values else ()
    for h in (Histogram((0.5, 1.0, 2.5)), Histogram((0.5, 1.0, 2.5), [1, 0, 3, 2], 17.25, 6)):
        ours = family.histogram_family() if values else BY_NAME["llamacpp_request_duration_seconds"].histogram_family()
        ours.add(values, h)
        theirs = HistogramMetricFamily(ours.name, ours.documentation, labels=labels)
        theirs.add_metric(list(values), h.buckets(), h.sum)
        assert ours.samples == theirs.samples
        assert [list(s.labels) for s in ours.samples] == [list(s.labels) for s in theirs.samples]


# ------------------------------------------------------------------------------------ names in the products
def family_of(name: str) -> Family | None:
    """The catalogued family a sample name belongs to (`x_bucket` to histogram `x`), or None."""
    if name in BY_NAME:
        return BY_NAME[name]
    for suffix in ("_bucket", "_sum", "_count"):
        f = BY_NAME.get(name.removesuffix(suffix))
        if name.endswith(suffix) and f is not None and suffix in SAMPLE_SUFFIXES.get(f.type, ()):
            return f
    return None


@cache
def _texts() -> dict[str, list[str]]:
    """Every string of the alert rules (expressions, annotations with their queries) and of the dashboard
    (queries, descriptions, titles), by file."""
    import yaml

    def strings(node: object) -> Iterator[str]:
        if isinstance(node, str):
            yield node
        elif isinstance(node, dict):
            for value in node.values():
                yield from strings(value)
        elif isinstance(node, list):
            for value in node:
                yield from strings(value)

    rules = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return {RULES.name: list(strings(rules)), DASHBOARD.name: list(strings(dashboard))}


def expanded(text: str) -> str:
    """`text` with each brace group of names written out: `x_{a,b}_y` is `x_a_y x_b_y`."""
    return BRACES.sub(lambda m: " ".join(m[1] + v + m[3] for v in m[2].split(",")), text)


def unknown_names(text: str) -> set[str]:
    """The metric names in `text` that are no catalogued family's samples, and its prefixes (`x_*`) of none."""
    text = expanded(text)
    unknown = {n for n in METRIC.findall(text) if family_of(n) is None}
    return unknown | {p + "*" for p in WILDCARD.findall(text) if not any(n.startswith(p) for n in BY_NAME)}


def wrong_label_values(expr: str) -> list[str]:
    """Matchers of a bounded label with a value its family never takes (`outcome="refusd"`); a regex matcher's
    plain alternatives (`a|b`) are each checked, Grafana's variables are not."""
    wrong = []
    for name, matchers in re.findall(r"(?<![\w:])(llamacpp_[a-z0-9_]+)\{([^}]*)\}", expr):
        family = family_of(name)
        if family is None:
            continue
        for label, op, value in re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"', matchers):
            allowed = family.values.get(label)
            if allowed is None or "$" in value:
                continue
            values = value.split("|") if op in ("=~", "!~") else [value]
            if op in ("=~", "!~") and not all(re.fullmatch(r"[\w/.:-]+", v) for v in values):
                continue  # a pattern, not a list of values
            wrong += [f"{name}{{{label}{op}{value!r}}}" for v in values if v not in allowed]
    return wrong


@pytest.mark.parametrize("source", [RULES.name, DASHBOARD.name])
def test_every_name_and_label_value_a_rule_or_panel_names_is_emitted(source: str) -> None:
    texts = _texts()[source]
    assert sum(len(METRIC.findall(t)) for t in texts) > 50, source  # the reader found the queries
    assert sorted(set().union(*(unknown_names(t) for t in texts))) == []
    assert [w for t in texts for w in wrong_label_values(t)] == []


def test_the_readers_catch_a_name_or_value_not_emitted() -> None:
    expr = 'rate(llamacpp_guard_requests_total{outcome="refusd"}[5m]) + instance:llamacpp_slots_processing:sum'
    assert unknown_names(expr + " + llamacpp_kv_pool_demand_tokens_bucket") == {
        "llamacpp_kv_pool_demand_tokens_bucket"  # a gauge has no buckets
    }
    assert wrong_label_values(expr) == ["llamacpp_guard_requests_total{outcome='refusd'}"]
    assert wrong_label_values('llamacpp_gpu_throttle_reason{reason=~"hw_slowdown|sw_power_cap"}') == []
    assert unknown_names("`llamacpp_host_memory_{available,total}_bytes`, `llamacpp_exporter_log_*`") == set()
    assert unknown_names("`llamacpp_host_memory_{free,total}_bytes`, `llamacpp_exporter_logs_*`") == {
        "llamacpp_host_memory_free_bytes",
        "llamacpp_exporter_logs_*",
    }
    assert family_of("llamacpp_guard_queue_wait_seconds_bucket") is BY_NAME["llamacpp_guard_queue_wait_seconds"]


# --------------------------------------------------------------------------------------------------- the docs
def documented_names(text: str) -> set[str]:
    """Metric names in `text`, with the README's shorthand expanded: "`a_total_bytes` / `_used_bytes`"
    names `a_used_bytes` (the shorthand replaces some of the name's last words: each reading is taken)."""
    names: set[str] = set()
    for m in re.finditer(r"`(llamacpp_[a-z0-9_]+)[^`]*`((?:\s*/\s*`_[a-z0-9_]+[^`]*`)+)", text):
        words = m.group(1).split("_")
        for short in re.findall(r"`(_[a-z0-9_]+)", m.group(2)):
            names |= {"_".join(words[:keep]) + short for keep in range(2, len(words))}
    return names | set(METRIC.findall(expanded(text)))


def test_the_shorthand_is_expanded() -> None:
    text = "| `llamacpp_gpu_memory_total_bytes` / `_used_bytes` / `_free_bytes{gpu}` | `llamacpp_x_lost_bytes_total` / `_long_lines_total` |"
    assert {"llamacpp_gpu_memory_used_bytes", "llamacpp_gpu_memory_free_bytes", "llamacpp_x_long_lines_total"} <= (
        documented_names(text)
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_metric_and_label_value_a_page_names_is_catalogued(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert sorted(unknown_names(text) - PACKAGES) == []
    assert wrong_label_values(text) == []


def test_every_metric_the_exporters_own_text_names_is_catalogued() -> None:
    """Its log messages, its flags' help and its docstrings' sample output name only families it emits."""
    named = {
        f"{path.relative_to(REPO)}: {name}"
        for path in sorted((REPO / "exporter").rglob("*.py"))
        for name in unknown_names(path.read_text(encoding="utf-8")) - PACKAGES
    }
    assert sorted(named) == []


def undocumented(pages: list[str]) -> list[str]:
    """The catalogued families no page names (a histogram or summary may be named by one of its samples)."""
    documented = set().union(*(documented_names(text) for text in pages))
    return sorted(
        f.name
        for f in CATALOGUE
        if f.name not in documented and not any(f.name + s in documented for s in SAMPLE_SUFFIXES.get(f.type, ()))
    )


def test_every_catalogued_family_is_documented() -> None:
    assert undocumented([p.read_text(encoding="utf-8") for p in REFERENCE]) == []


def test_an_undocumented_family_is_found() -> None:
    pages = [p.read_text(encoding="utf-8").replace("llamacpp_guard_access_log_lines_total", "") for p in REFERENCE]
    assert undocumented(pages) == ["llamacpp_guard_access_log_lines_total"]


def test_every_guard_outcome_is_named_where_the_outcomes_are_explained() -> None:
    """`Outcome` is the one list of the guard's outcomes; the texts that explain them one by one name each:
    the family's help, docs/guard.md's row and its count of series, the dashboard's outcomes panel (whose
    colours are given to outcomes only). A new outcome fails here until each says what it is."""
    from exporter.metrics.catalogue.guard import GUARD_REQUESTS, OUTCOMES

    guard_md = (REPO / "docs" / "guard.md").read_text(encoding="utf-8")
    (row,) = [line for line in guard_md.splitlines() if line.startswith("| `llamacpp_guard_requests_total{outcome}`")]
    (panel,) = [
        p for p in json.loads(DASHBOARD.read_text(encoding="utf-8"))["panels"] if p["title"].endswith("by outcome")
    ]
    for where, text in (("help", GUARD_REQUESTS.help), ("docs/guard.md", row), ("dashboard", panel["description"])):
        assert [o for o in OUTCOMES if not re.search(rf"\b{o}\b", text)] == [], where
    assert f"times {len(OUTCOMES)} outcomes" in guard_md
    coloured = [o["matcher"]["options"] for o in panel["fieldConfig"]["overrides"]]
    assert coloured and {c.removeprefix(".* ").removesuffix("$") for c in coloured} <= set(OUTCOMES), coloured
