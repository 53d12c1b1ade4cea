"""`--process-source`: which reader of llama-server's process this host gets (/proc or psutil)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from exporter.sources.process import FinderArgs, ProcessFinder
from exporter.sources.procfs import ProcReader

if TYPE_CHECKING:
    from typing_extensions import Unpack


def proc_self_readable(proc_root: str | os.PathLike[str]) -> bool:
    """Whether `<proc_root>/self/stat` can be read: /proc is there."""
    try:
        with (Path(proc_root) / "self" / "stat").open("rb") as f:
            f.read(1)
    except OSError:
        return False
    return True


def resolve_process_source(source: str, proc_root: str | os.PathLike[str]) -> str:
    """`--process-source`: auto is procfs where `<proc_root>/self/stat` is readable (Linux), else psutil."""
    if source != "auto":
        return source
    return "procfs" if proc_self_readable(proc_root) else "psutil"


def open_process_reader(source: str, proc_root: str | os.PathLike[str], **finder: Unpack[FinderArgs]) -> ProcessFinder:
    """The reader `--process-source` asks for (`auto`, `procfs` or `psutil`), built with the finder's arguments.

    psutil is imported only here, when chosen: an exporter on /proc never loads it.
    """
    if resolve_process_source(source, proc_root) == "procfs":
        return ProcReader(proc_root, **finder)
    from exporter.sources.psutil_reader import PsutilReader

    return PsutilReader(**finder)
