"""A router's log split by its `[PORT] ` prefix, each part parsed. Pure: no I/O, no state, no clock.

A router (`llama-server --models-dir DIR` or `--models-preset FILE`, b7218+) writes each child's lines
into its own log as `[PORT] line`; its own lines have no prefix:

    0.03.218.682 I srv          load: spawning server instance with name=alpha on port 58071
    [58071] 0.00.002.135 I srv  llama_server: initializing ...
    0.17.570.302 I srv           run: instance name=beta exited with status 0

`split_parse` turns a batch of lines into parts, in order: `(None, events)` for a run of lines without
a prefix (the router's, or a plain llama-server's), and `(port, events)` for a child's lines. Between
two of the router's own lines, each child's lines are one part (children are independent of each other;
only their order around the router's lines matters), so each part is one regex scan (`parse_lines`).
Where each part goes is the model's business (`exporter.model.router.ServerLog.apply`).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from typing import TypeAlias

from exporter.logs import events as ev
from exporter.logs.batch import joined
from exporter.logs.parse import RoutedLine, parse_joined, parse_lines

#: A router child's line prefix, as the parser strips it; `diagnose` reads it here too.
PREFIX = re.compile(r"\[[^\S\n]*(\d+)\] ")
#: Events of consecutive lines from one place: `None` for lines without a prefix, else the child's port.
Part: TypeAlias = tuple[int | None, list[ev.Event]]


def router_port(line: str) -> int | None:
    """The port in a router child's line prefix `[PORT] `, if the line has one (0 for digits no port has)."""
    if line[:1] == "[":
        m = PREFIX.match(line)
        if m is not None:
            digits = m.group(1)
            return int(digits) if len(digits) <= 5 else 0  # never int() of thousands of digits
    return None


def split_parse(lines: Sequence[str]) -> list[Part]:
    """The events of a batch of lines, in parts by where each line comes from (see the module's docstring)."""
    # One part, one scan, unless a line that carries an event has a prefix: the scan tells, at no cost a line
    # (lines with a prefix but no event add nothing to any part). A router's batch is scanned again, in parts.
    with contextlib.suppress(RoutedLine):
        return [(None, parse_joined(joined(lines), lines, unrouted=True))]
    parts: list[Part] = []
    main: list[str] = []
    children: dict[int, list[str]] = {}
    for line in lines:
        port = router_port(line)
        if port is None:
            if children:
                parts.extend((p, parse_lines(child)) for p, child in children.items())
                children = {}
            main.append(line)
        else:
            if main:
                parts.append((None, parse_lines(main)))
                main = []
            children.setdefault(port, []).append(line)
    if main:
        parts.append((None, parse_lines(main)))
    if children:
        parts.extend((p, parse_lines(child)) for p, child in children.items())
    return parts
