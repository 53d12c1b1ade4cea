"""Hostile log lines: poison, huge numbers, seeded mutations of the real captures' lines."""

from __future__ import annotations

import random

from paths import B11434

from exporter.logs.parse import parse_lines
from exporter.model.state import ServerState

HUGE = "9" * 5000  # more digits than int() reads (4,300 by default): ValueError
#: (line, the rejection reason it must be counted under)
POISON: list[tuple[str, str]] = [
    ("slot print_timing: id  0 | task 1 | prompt eval time = 1.2.3 ms / 1 tokens", "malformed"),
    (f"slot print_timing: id  0 | task 1 | prompt eval time = 1{HUGE} ms / 1 tokens", "out_of_range"),  # float: inf
    (f"srv    send_error: task id = {HUGE}, error: Context size has been exceeded.", "malformed"),
    (f"slot launch_slot_: id  {HUGE} | task 5 | processing task, is_child = 0", "malformed"),
    ("srv    load_model: initializing, n_slots = 1000000000, n_ctx_slot = 512, kv_unified = 'true'", "out_of_range"),
    ("slot launch_slot_: id  1000000 | task 5 | processing task, is_child = 0", "out_of_range"),
    (
        "slot      release: id  0 | task 9 | stop processing: n_tokens = 100000000000000000000, truncated = 0",
        "out_of_range",
    ),
    (
        "slot update_slots: id  0 | task 9 | created context checkpoint 1 of 3 (pos_min = 0, pos_max = 10, "
        "size = 99999999999999.0 MiB)",
        "out_of_range",
    ),
    ("llama_context: n_ctx         = 99999999999999", "out_of_range"),
]


def apply_all(state: ServerState, lines: list[str]) -> None:
    """Parse ``lines`` and apply every event to ``state``."""
    for e in parse_lines(lines):
        state.apply(e)


def captured(name: str) -> list[str]:
    """The lines of the b11434 capture ``name``."""
    return (B11434 / name / "llama-server.log").read_text(encoding="utf-8").splitlines()


def mutate(rng: random.Random, line: str) -> str:
    """One fuzzer step: flip, insert or delete characters, splice digits, or graft another line's tail."""
    kind = rng.randrange(6)
    if not line:
        return line
    i = rng.randrange(len(line))
    if kind == 0:
        return line[:i] + chr(rng.randrange(32, 127)) + line[i + 1 :]
    if kind == 1:
        return line[:i] + rng.choice(["9" * rng.randrange(1, 40), "1.2.3", "-", "\x1b[31m", "|", "= ", " "]) + line[i:]
    if kind == 2:
        return line[:i] + line[i + rng.randrange(1, 8) :]
    if kind == 3:
        return line.replace(rng.choice("0123456789"), rng.choice(["99999999999", "1e9", "", "7"]))
    if kind == 4:
        return line[:i]
    return line + line[i:]
