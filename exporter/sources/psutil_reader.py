"""llama-server's process and the host's memory through psutil: Windows, macOS, or wherever /proc is missing.

Same rules (`exporter.sources.process`) and the same `ProcSnapshot` as the /proc reader. What psutil
can and cannot see, by system:

- Name, command line, RSS, start time and children: everywhere, for any user's process on Linux and
  macOS; on Windows another user's process (a service) may refuse its command line unless the exporter
  runs as an administrator.
- Environment (`LLAMA_ARG_*`): the exporter's own user's processes only on macOS (AccessDenied
  otherwise: `environ_readable` is False and the command line alone counts).
- Open files: psutil lists regular files with their open mode on Linux only; on Windows and macOS a
  listed file has no mode. There a llama-server holding our log open is taken as writing it (it opens
  its log only to write), while an unnamed process holding it (an editor, `Get-Content -Wait`) cannot be
  told from a writer and is never taken, unless it is the wrapper that started llama-server (its parent,
  e.g. PowerShell writing the server's output with `2>`). Pipes are not listed anywhere: with `--log-file -` the writer
  of our standard input is taken to be the llama-server in our pipeline, the one started by the same
  parent (the shell running `llama-server … | llamacpp-exporter --log-file -`) or by the exporter itself,
  when there is exactly one; else, when none is, the one started by a process of our pipeline (a wrapper:
  `wrapper | llamacpp-exporter --log-file -`), when there is exactly one. A llama-server outside the
  pipeline cannot write into its pipe: never taken, whatever else runs on the host.
- The journal unit's cgroup: Linux only; use the /proc reader there.

Host memory is `psutil.virtual_memory()`: `available` is MemAvailable on Linux, the available physical
memory (`ullAvailPhys`) on Windows, free plus inactive pages on macOS.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

import psutil

if TYPE_CHECKING:
    from typing_extensions import Unpack

from exporter.model.live import HostMemory, ProcessInfo
from exporter.sources.process import Candidate, FinderArgs, ProcessFinder, file_id, is_server

#: Errors of a process that exited (or turned zombie) meanwhile, or that this user may not look at.
_GONE = (psutil.NoSuchProcess, psutil.ZombieProcess)
_ERRORS = (psutil.Error, OSError)


def _ticks(p: psutil.Process) -> int:
    """The process's start identity: its creation time in milliseconds (see `ProcessInfo.start_ticks`)."""
    return round(float(p.create_time()) * 1000)


def _parent(p: psutil.Process) -> int | None:
    try:
        return int(p.ppid())
    except _ERRORS:
        return None


def _running(p: psutil.Process) -> bool:
    return bool(p.status() != psutil.STATUS_ZOMBIE)


class PsutilReader(ProcessFinder):
    """Finds llama-server among the host's processes through psutil and reads it. Never raises from `read()`.

    `processes` lists the processes to look at (every one on the host by default; a test narrows it).
    """

    where = "among this host's processes"

    def __init__(
        self, *, processes: Callable[[], Iterable[psutil.Process]] | None = None, **finder: Unpack[FinderArgs]
    ) -> None:
        super().__init__(**finder)
        self._processes = processes or psutil.process_iter
        self._pipeline: set[int] = set()  # named processes in our pipeline (our parent's children, or ours)
        self._started_by_pipeline: set[int] = set()  # named processes started by another process of our pipeline
        # Whether psutil's open files carry their mode here (Linux); elsewhere a reader looks like a writer.
        self._modes = psutil.LINUX

    # ------------------------------------------------------------------ reading

    def host_memory(self) -> tuple[HostMemory | None, str | None]:
        try:
            vm = psutil.virtual_memory()
        except _ERRORS as exc:
            return None, f"cannot read the host's memory (psutil): {exc}"
        return HostMemory(int(vm.total), int(vm.available)), None

    def process(self, pid: int, found_by: str) -> tuple[ProcessInfo | None, str | None]:
        try:
            p = psutil.Process(pid)
            with p.oneshot():
                if not _running(p):
                    return None, None  # exited, not yet reaped: it holds no memory and serves nothing
                created = p.create_time()
                rss = int(p.memory_info().rss)
                argv = p.cmdline()
        except _GONE:
            return None, None
        except psutil.AccessDenied as exc:
            return None, (
                f"llama-server pid {pid} ({found_by}) cannot be read by this user ({exc.msg or 'access denied'}): "
                "run the exporter as llama-server's user or as an administrator"
            )
        except _ERRORS as exc:
            return None, f"llama-server pid {pid} ({found_by}): {exc}"
        environ, environ_readable = self._environ(p)
        info = ProcessInfo(
            pid=pid,
            start_ticks=round(created * 1000),
            start_time_seconds=created,
            rss_bytes=rss,
            command_line=self.command_line(argv, environ),
            found_by=found_by,
            environ_readable=environ_readable,
        )
        return info, None

    @staticmethod
    def _environ(p: psutil.Process) -> tuple[dict[str, str], bool]:
        """The process environment; another user's is refused on macOS (and on Windows without admin)."""
        try:
            return dict(p.environ()), True
        except _ERRORS:
            return {}, False

    # ------------------------------------------------------------------ seeing processes

    def start_ticks(self, pid: int) -> int | None:
        try:
            p = psutil.Process(pid)
            return _ticks(p) if _running(p) else None
        except _ERRORS:
            return None

    def candidates(self, log_real: str | None, log_stat: tuple[int, int] | None) -> Iterator[Candidate]:
        family = self._family() if self.log_file is None else set()
        self._pipeline, self._started_by_pipeline = set(), set()
        for p in self._processes():
            if p.pid == self.self_pid:
                continue
            try:
                with p.oneshot():
                    if not _running(p):
                        continue
                    ticks, name = _ticks(p), p.name()
                    try:
                        argv = p.cmdline()
                    except psutil.AccessDenied:
                        argv = []  # a Windows service's process: its name may still say llama-server
            except _ERRORS:
                continue  # gone meanwhile, or a system process this user may not look at
            named = is_server(name, argv)
            if named and self.log_file is None:
                parent = _parent(p)
                if parent in family:
                    self._pipeline.add(p.pid)
                elif parent is not None and parent > 1 and self.parent(parent) in family:
                    self._started_by_pipeline.add(p.pid)
            if named and not argv:
                yield Candidate(p.pid, ticks, True, None)  # whether it names our log cannot be told
                continue
            names_log = self.names_log(p.pid, argv, self._environ(p)[0], log_real, log_stat) if named else None
            yield Candidate(p.pid, ticks, named, names_log)

    def _family(self) -> set[int]:
        """The exporter and its parent (not init): whoever started a server writing into our standard input."""
        family = {self.self_pid}
        with contextlib.suppress(*_ERRORS, ValueError):  # ValueError: no such pid (a test's self_pid)
            parent = psutil.Process(self.self_pid).ppid()
            if parent > 1:
                family.add(parent)
        return family

    def children(self, parent: int) -> Iterator[tuple[int, list[str]]]:
        try:
            kids = psutil.Process(parent).children()
        except _ERRORS:
            return
        for p in kids:
            try:
                yield p.pid, p.cmdline()
            except _ERRORS:
                continue

    def in_unit(self, unit: str) -> Iterator[tuple[int, int]]:
        # A systemd unit's cgroup is read from /proc: the journal source runs on Linux, with the /proc reader.
        raise OSError(f"finding the process of the journal unit {unit} needs /proc (--process-source procfs)")

    def cwd(self, pid: int) -> str | None:
        try:
            return str(psutil.Process(pid).cwd())
        except _ERRORS:
            return None

    def parent(self, pid: int) -> int | None:
        try:
            return _parent(psutil.Process(pid))
        except _ERRORS:
            return None

    def wrapper_writes(self, pid: int, target: tuple[int, int]) -> bool:
        # Without the open mode (Windows, macOS), a wrapper holding the log of the llama-server it started writes it.
        return self._holds(pid, target, writing=self._modes) is True

    def writes(self, c: Candidate, target: tuple[int, int]) -> bool | None:
        if not c.named and not self._modes:
            return None  # without the open mode a reader cannot be told from a writer: never taken
        if self.log_file is None:  # our standard input's pipe, which psutil does not list: our pipeline's server
            ours = self._pipeline or self._started_by_pipeline
            if c.pid not in ours:
                return False  # outside our pipeline: it cannot write into the pipe
            return True if ours == {c.pid} else None
        # A llama-server holding its log open writes it, whether or not the mode is known.
        return self._holds(c.pid, target, writing=self._modes)

    @staticmethod
    def _holds(pid: int, target: tuple[int, int], *, writing: bool) -> bool | None:
        """Whether the process has `target` open (for writing, where `writing`); None if that cannot be told."""
        try:
            files = psutil.Process(pid).open_files()
        except _GONE:
            return False  # it exited since it was listed: it writes nothing
        except _ERRORS:
            return None  # another user's process
        return any(file_id(f.path) == target and not (writing and getattr(f, "mode", "r") == "r") for f in files)
