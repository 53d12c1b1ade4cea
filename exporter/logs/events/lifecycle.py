"""A server process's life: its start-up banner, the model loading, ready and exiting, and how its lines are written."""

from __future__ import annotations

from dataclasses import field
from typing import TypeAlias

from exporter.logs.event_class import event


@event
class ServerStarting:
    """First lines of a server process (banner); a new process means every slot starts empty."""

    build: int | None = None


@event
class BuildInfo:
    """`build: 4747 (c392e509)`, `build_info: b8668-5d3a4a7da`, `common_params_print_info: build 11434 (…)`."""

    build: int
    commit: str
    # Which of the two lines: an in-process server (xllamacpp) prints both at one start (`build_info: b0-unknown`,
    # then `common_params_print_info: build 0 (unknown)` at -lv 4), so they are two banners, not one repeated.
    tag: bool = field(default=False, compare=False, repr=False)  # True: the `build_info: bN-commit` line


@event
class Verbosity:
    """`verbosity = 4 (adjust with the -lv N CLI arg)`: printed only at -lv 4 and above on b9151+."""

    level: int


#: The start-up banner lines: the first of them in a file, or one the start in progress already printed,
#: is a new server process.
BANNERS = frozenset({ServerStarting, BuildInfo, Verbosity})


def banner_line(e: ServerStarting | BuildInfo | Verbosity) -> object:
    """Which banner line `e` is: one start prints each of them at most once (two wordings of the build line)."""
    return (BuildInfo, e.tag) if type(e) is BuildInfo else type(e)


@event
class ModelLoading:
    """`loading model 'path'` (b4274+)."""

    model: str


@event
class ServerReady:
    """`listening on http://…` / `server is listening on …`: the model is loaded and /health answers 200."""

    address: str


@event
class ModelLoadFailed:
    """`load_model: failed to load model, '/models/x.gguf'`: the start fails; the server exits."""

    model: str


@event
class ServerExiting:
    """`cleaning up before exit...`: the server is shutting down on its own terms (a signal it handles,
    or the end of its main loop), not crashing."""


@event
class MemoryProjection:
    """`common_params_fit_impl: projected to use 9876 MiB of device memory vs. 10240 MiB of free device
    memory` (`… of host memory vs. N MiB of total host memory` without a GPU): the memory the model and
    its context will take at start, and what there is (b7xxx+, printed before the model loads)."""

    kind: str  # device | host
    used_mib: int
    available_mib: int


@event
class LineFormat:
    """How the lines that follow are written (not a log line of its own): the parser emits it before an
    event whose line is written differently from the previous event's line.

    `code` is a bit set of what the line had: `LEVEL` (`I `), `TIMESTAMP` (`0.00.003.960 `), `JSONL` (a
    `--log-jsonl` object), `COLOURS` (a prefix in colour). A server start fixes its run's format; see
    `exporter.model.provenance`.
    """

    code: int

    LEVEL = 1
    TIMESTAMP = 2
    JSONL = 4
    COLOURS = 8

    def describe(self) -> str:
        """`timestamp+level`, `jsonl`, `plain`: the format in words, for messages."""
        names = ("level", "timestamp", "jsonl", "colours")
        parts = [name for bit, name in enumerate(names) if self.code >> bit & 1]
        return "+".join(reversed(parts)) if parts else "plain"


#: The kinds of this family (`exporter.logs.events.Event` is the union of the families').
LifecycleEvent: TypeAlias = (
    ServerStarting
    | BuildInfo
    | Verbosity
    | ModelLoading
    | ServerReady
    | ModelLoadFailed
    | ServerExiting
    | MemoryProjection
    | LineFormat
)

__all__ = [
    "BANNERS",
    "BuildInfo",
    "LifecycleEvent",
    "LineFormat",
    "MemoryProjection",
    "ModelLoadFailed",
    "ModelLoading",
    "ServerExiting",
    "ServerReady",
    "ServerStarting",
    "Verbosity",
    "banner_line",
]
