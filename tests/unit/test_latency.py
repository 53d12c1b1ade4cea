"""Why a first token was slow: each request's time to first token under the cache outcome its log shows,
on the real b11434 sliding-window capture (tiny gemma2, -ctxcp 3, -lv 4), the outcome derived here from the
task's own lines; the same capture as `-lv 3` shows it, and with its checkpoint restore turned into a miss."""

from __future__ import annotations

import re

from paths import B11434

from exporter.logs.parse import normalize, parse_message
from exporter.model.latency import CACHE_OUTCOMES
from exporter.model.state import ServerState

LOG = (B11434 / "checkpoints-swa-lv4" / "llama-server.log").read_text(encoding="utf-8").splitlines()
_TASK = re.compile(r"\| task (\d+) \| (.*)$")


def _state(lines: list[str]) -> ServerState:
    state = ServerState()
    for line in lines:
        event = parse_message(normalize(line))
        if event is not None:
            state.apply(event)
    assert state.rejected == {}
    return state


def _outcomes(lines: list[str]) -> dict[str, list[float]]:
    """Each finished request's prompt eval seconds by the outcome its task's lines show (the documented rule)."""
    first_cached: dict[int, int] = {}
    said: dict[int, str] = {}
    out: dict[str, list[float]] = {o: [] for o in CACHE_OUTCOMES}
    for line in lines:
        m = _TASK.search(line)
        if m is None:
            continue
        task, text = int(m[1]), m[2]
        if c := re.match(r"cached n_tokens = (\d+)", text):
            first_cached.setdefault(task, int(c[1]))
        elif text.startswith("forcing full prompt re-processing"):
            said[task] = "full_reprocess"
        elif text.startswith("restored context checkpoint"):
            said.setdefault(task, "checkpoint_restored")
        elif t := re.match(r"prompt eval time = +([\d.]+) ms / +(\d+) tokens", text):
            cached = first_cached.get(task)
            outcome = said.get(task) or (
                "unknown" if cached is None else "cached" if 0 < cached >= int(t[2]) else "cold"
            )
            out[outcome].append(float(t[1]) / 1000.0)
    return out


def _observed(state: ServerState) -> dict[str, list[float]]:
    return {o: [state.latency.ttft[o].count, state.latency.ttft[o].sum] for o in CACHE_OUTCOMES}


def _expected(lines: list[str]) -> dict[str, list[float]]:
    return {o: [len(v), sum(v, 0.0)] for o, v in _outcomes(lines).items()}


def test_each_first_token_is_labelled_by_the_cache_outcome_of_its_request() -> None:
    state = _state(LOG)
    assert _observed(state) == _expected(LOG)
    counts = {o: h.count for o, h in state.latency.ttft.items() if h.count}
    assert counts == {"cold": 1, "cached": 3, "checkpoint_restored": 1}
    assert state.latency.cached_tokens == 0 + 240 + 260 + 121 + 120  # each request's first `cached n_tokens`
    assert state.latency.reprocessed_tokens == 0


def test_a_missed_checkpoint_is_a_full_reprocess_and_counts_its_prompt_again() -> None:
    missed = [
        line.split("restored context checkpoint")[0] + "forcing full prompt re-processing due to lack of cache data"
        if "restored context checkpoint" in line
        else line
        for line in LOG
    ]
    state = _state(missed)
    assert _observed(state) == _expected(missed)
    assert state.latency.ttft["full_reprocess"].count == 1 and state.latency.ttft["checkpoint_restored"].count == 0
    assert state.latency.reprocessed_tokens == 41  # its `prompt eval time … / 41 tokens`
    assert state.full_reprocess == 1


def test_at_default_verbosity_hidden_cache_lines_make_the_outcome_unknown() -> None:
    """`-lv 3` hides `cached n_tokens`: cached and cold cannot be told apart, and are not guessed."""
    lv3 = [line for line in LOG if "cached n_tokens" not in line]
    state = _state(lv3)
    assert _observed(state) == _expected(lv3)
    assert state.latency.ttft["unknown"].count == 4 and state.latency.ttft["checkpoint_restored"].count == 1
    assert state.latency.cached_tokens == 0


def test_a_replayed_log_observes_nothing() -> None:
    state = ServerState(counting=False)
    for line in LOG:
        event = parse_message(normalize(line))
        if event is not None:
            state.apply(event)
    assert all(h.count == 0 for h in state.latency.ttft.values()) and state.latency.duration.count == 0


# b11434's format string (`strings llama-server` of the b11434 build; print_timing, after `total time`).
_DRAFT_B11434 = (
    "slot %12.*s: id %2d | task %d | draft acceptance = %0.5f (%5d accepted / %5d generated), mean len = %5.2f"
)


def _draft_line(prefix: str, slot: int, task: int, accepted: int, generated: int) -> str:
    fmt = _DRAFT_B11434.replace("%12.*s", "%12s")  # Python's % has no `.*` precision from an argument
    return prefix + fmt % ("print_timing", slot, task, accepted / generated, accepted, generated, 2.5)


def test_speculative_decoding_counts_the_draft_tokens_printed_with_each_requests_timings() -> None:
    lines: list[str] = []
    drafts = iter([(30, 40), (7, 9), (0, 3), (12, 12), (1, 2)])
    for line in LOG:
        lines.append(line)
        if m := re.match(r"(\S+ I )slot print_timing: id +(\d+) \| task (\d+) \| +total time", line):
            lines.append(_draft_line(m[1], int(m[2]), int(m[3]), *next(drafts)))
    state = _state(lines)
    assert (state.latency.draft_accepted, state.latency.draft_generated) == (30 + 7 + 0 + 12 + 1, 40 + 9 + 3 + 12 + 2)
    written = (
        r"I slot print_timing: id  0 \| task 2 \| draft acceptance = 0\.75000 \(   30 accepted /    40 generated\)"
    )
    assert any(re.search(written, line) for line in lines)


def test_the_older_draft_line_is_believed_after_its_timings_only() -> None:
    """Before b9230 the summary is its own untagged line, after a head of its own or right after the timings."""
    head = "slot print_timing: id  0 | task 2 | "
    old = [
        head,
        "prompt eval time =       4.21 ms /   240 tokens (    0.02 ms per token, 56980.06 tokens per second)",
        "       eval time =      10.00 ms /     8 tokens (    1.25 ms per token,   800.00 tokens per second)",
        "      total time =      14.21 ms /   248 tokens",
        head,
        "draft acceptance rate = 0.75000 (   30 accepted /    40 generated)",
    ]
    lines = LOG[:180] + [line for line in LOG[180:] if "print_timing" not in line]
    at = next(i for i, line in enumerate(lines) if "task 2 | stop processing" in line)
    state = _state(lines[:at] + [line.split(" I ", 1)[-1] if line.startswith("0.") else line for line in old])
    assert (state.latency.draft_accepted, state.latency.draft_generated) == (30, 40)
    assert state.latency.duration.count == 1


def test_finish_reasons_are_counted_from_the_stopped_lines_and_errors() -> None:
    path = B11434.parent / "b9093" / "checkpoints" / "llama-server.log"
    lines = path.read_text(encoding="utf-8").splitlines()
    state = _state(lines)
    assert state.latency.finish_reasons == {"limit": sum("stopped by limit" in line for line in lines)} == {"limit": 5}
