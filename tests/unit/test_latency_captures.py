"""Every finished request of every capture of every build, in the latency histograms: each histogram's count
is the number of `print_timing` entries of the logs, and its sum their figures, read here independently of
the exporter's parser with plain regexes (slot-tagged lines since b9230, untagged continuation lines before).

The expositions are the log goldens (tests/fixtures/golden, held byte for byte to the production assembly
by test_exposition_golden.py). Counts are exact. A single server's sums are exact where the family is one
series (the same figures added in the same order); the time to first token is one series per cache outcome,
and the router's children are separate series, whose sums this test adds in another order than the log's:
equal within float rounding (relative 1e-12).
"""

from __future__ import annotations

import re

import pytest
from log_goldens import BUILDS, CAPTURES, Capture
from prometheus_client.parser import text_string_to_metric_families

_PROMPT = re.compile(r"prompt eval time = +([\d.]+) ms / +(\d+) tokens")
_EVAL = re.compile(r"(?<!prompt )eval time = +([\d.]+) ms / +(\d+) tokens")
_TOTAL = re.compile(r"total time = +([\d.]+) ms / +(\d+) tokens")


def _log_figures(capture: Capture) -> dict[str, tuple[int, float]]:
    """(count, sum) each histogram should show, from the capture's log text."""
    lines: list[str] = []
    for i, name in enumerate(capture.logs):
        text = (capture.folder / name).read_text(encoding="utf-8", errors="replace").splitlines()
        last = i == len(capture.logs) - 1
        lines += text[: capture.until] if last and capture.until is not None else text
    figures: dict[str, list[float]] = {"ttft": [], "prompt": [], "tpot": [], "generated": [], "duration": []}
    for line in lines:
        if m := _PROMPT.search(line):
            figures["ttft"].append(float(m[1]) / 1000.0)
            figures["prompt"].append(int(m[2]))
        elif m := _EVAL.search(line):
            figures["generated"].append(int(m[2]))
            if int(m[2]) > 0:
                figures["tpot"].append(float(m[1]) / int(m[2]) / 1000.0)
        elif m := _TOTAL.search(line):
            figures["duration"].append(float(m[1]) / 1000.0)
    out = {}
    for key, values in figures.items():
        total = 0.0
        for v in values:  # in the log's order, as the exporter adds them
            total += v
        out[key] = (len(values), total)
    return out


_FAMILIES = {
    "ttft": "llamacpp_time_to_first_token_seconds",
    "prompt": "llamacpp_request_prompt_eval_tokens",
    "tpot": "llamacpp_time_per_output_token_seconds",
    "generated": "llamacpp_request_generation_tokens",
    "duration": "llamacpp_request_duration_seconds",
}


def _exposed(capture: Capture) -> dict[str, tuple[int, float]]:
    """(count, sum) of each latency histogram in the capture's golden exposition, over every series."""
    text = capture.golden.read_text(encoding="utf-8")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    out = {}
    for key, name in _FAMILIES.items():
        samples = families[name].samples
        count = sum(s.value for s in samples if s.name == name + "_count")
        total = 0.0
        for s in samples:
            if s.name == name + "_sum":
                total += s.value
        out[key] = (int(count), total)
    return out


#: The router's end: no child runs any more, and an ended child's series are dropped (docs/many-servers.md).
_NO_SERVER = {"router/end"}


def test_an_ended_childs_latency_series_are_dropped() -> None:
    (end,) = [c for c in CAPTURES if c.id in _NO_SERVER]
    assert "llamacpp_time_to_first_token_seconds" not in end.golden.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "capture", [c for c in CAPTURES if not c.replayed and c.id not in _NO_SERVER], ids=lambda c: c.id
)
def test_latency_histograms_count_every_finished_request_with_the_logs_figures(capture: Capture) -> None:
    expected, exposed = _log_figures(capture), _exposed(capture)
    assert expected["duration"][0] == expected["ttft"][0]  # one entry per finished request, three lines each
    split = {"ttft"} if capture.folder.name != "router" else set(_FAMILIES)
    assert exposed == {k: (n, pytest.approx(s, rel=1e-12) if k in split else s) for k, (n, s) in expected.items()}


def test_the_captures_hold_finished_requests_of_every_build() -> None:
    """Most captures end in an overflow that aborts every request; each build still has finished ones."""
    finished: dict[str, int] = {}
    for c in CAPTURES:
        if not c.replayed:
            build = c.id.split("/")[0]
            finished[build] = finished.get(build, 0) + _log_figures(c)["ttft"][0]
    assert set(finished) == BUILDS | {"router"} and all(finished.values()), finished


@pytest.mark.parametrize("capture", [c for c in CAPTURES if c.replayed], ids=lambda c: c.id)
def test_a_replayed_log_counts_no_request(capture: Capture) -> None:
    assert all(n == 0 for n, _ in _exposed(capture).values())


_STOPPED = re.compile(r"\| stopped (?:by (EOS|limit|time limit|indentation limit)\b|due to running out of context)")
_WORDS = {"EOS": "eos", "limit": "limit", "time limit": "time_limit", "indentation limit": "indentation_limit"}


@pytest.mark.parametrize(
    "capture", [c for c in CAPTURES if not c.replayed and c.id not in _NO_SERVER], ids=lambda c: c.id
)
def test_finish_reasons_count_every_stopped_line_and_error(capture: Capture) -> None:
    lines: list[str] = []
    for i, name in enumerate(capture.logs):
        text = (capture.folder / name).read_text(encoding="utf-8", errors="replace").splitlines()
        lines += text[: capture.until] if i == len(capture.logs) - 1 and capture.until is not None else text
    expected: dict[str, float] = {}
    for line in lines:
        if m := _STOPPED.search(line):
            reason = _WORDS[m[1]] if m[1] else "context_capacity"
            expected[reason] = expected.get(reason, 0) + 1
        elif "send_error: task id = " in line:
            reason = "cancelled" if "cancel" in line.lower() else "error"
            expected[reason] = expected.get(reason, 0) + 1
    families = {f.name: f for f in text_string_to_metric_families(capture.golden.read_text(encoding="utf-8"))}
    exposed: dict[str, float] = {}
    for s in families["llamacpp_request_finish_reasons"].samples:
        if s.value:
            exposed[s.labels["reason"]] = exposed.get(s.labels["reason"], 0) + s.value
    assert exposed == expected
