"""llama-server's process and the host's memory: the snapshot, and the rules that find the process.

Two readers fill the same `ProcSnapshot`: `procfs.ProcReader` (Linux's /proc, the default there) and
`psutil_reader.PsutilReader` (Windows and macOS, or wherever /proc is missing). They differ only in how
they see a process (its name, command line, environment, open files, children); which process is
llama-server's is decided once, here, by `ProcessFinder`:

1. `--pid N`, or `--pid-file PATH` (read at every scrape, so a restarted server is followed);
2. automatically: a process named `llama-server` that names the log file (`--log-file`,
   `LLAMA_ARG_LOG_FILE`) or holds it open for writing (compared by device and inode); then any process
   writing the log file (a renamed binary); then a `llama-server` whose parent writes it (a wrapper that
   keeps its output, like PowerShell's `2>`). With standard input (`llama-server … | llamacpp-exporter
   --log-file -`) the `llama-server` writing into that pipe. Last, by name: the only `llama-server`
   whose relation to the log cannot be told (its descriptors are unreadable to a non-root exporter, or
   it was given no log at all); one known to write another log is never taken. While our log file does
   not exist yet, no process writes it: only a server that names it is taken, whatever else runs on the
   host. A process taken by name is a guess: said once in the log, and `found_by` says "name".
   With the journal as the log (`unit`): the newest `llama-server` in that unit's cgroup.
3. a router child (`router_pid`, `port`): the router's child process started with `--port PORT`.

The exporter itself never matches. The found pid is kept while it lives with the same start time; only
then are the processes scanned again.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    pass

from exporter.model.live import HostMemory, ProcessInfo, ProcSnapshot
from exporter.model.server_cmdline import ServerCommandLine, parse_command_line

logger = logging.getLogger(__name__)

SERVER_NAME = "llama-server"


@dataclass(frozen=True)
class Candidate:
    """A running process, as far as finding llama-server's needs it."""

    pid: int
    start_ticks: int
    named: bool  # called llama-server (its name or argv[0])
    # Whether its command line or environment names our log: True, False (names another file), None (cannot tell).
    names_log: bool | None


def is_server(name: str, argv: list[str]) -> bool:
    """Whether a process is called llama-server: by its name (comm, image name) or its argv[0]'s file name."""
    exe = re.split(r"[\\/]", argv[0])[-1] if argv else ""
    return SERVER_NAME in name or SERVER_NAME in exe


def llama_environ(items: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Only the `LLAMA_*` variables: llama-server's settings, and nothing else of a process's environment."""
    return {k: v for k, v in items if k.startswith("LLAMA_")}


def port_of(argv: list[str]) -> str | None:
    """The value of `--port` in a command line (how a router starts each child)."""
    return next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--port"), None)


def file_id(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    """(device, inode) of a file (on Windows the volume serial and NTFS file ID), or None."""
    try:
        st = Path(path).stat()
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


class FinderArgs(TypedDict, total=False):
    """What `ProcessFinder` is told about the process to find (each reader takes these as keywords)."""

    pid: int | None
    pid_file: str | None
    log_file: str | None
    stdin_fd: int | None
    unit: str | None
    self_pid: int | None
    router_pid: Callable[[], int | None] | None
    port: int | None


class ProcessFinder(ABC):
    """Finds llama-server's process by the rules in this module's docstring and reads it. Never raises
    from `read()`. Subclasses say how a process is seen; not thread-safe: one read at a time."""

    def __init__(
        self,
        *,
        pid: int | None = None,
        pid_file: str | None = None,
        log_file: str | None = None,
        stdin_fd: int | None = None,
        unit: str | None = None,
        self_pid: int | None = None,
        router_pid: Callable[[], int | None] | None = None,
        port: int | None = None,
    ) -> None:
        # A router child: the process the router (its pid, from the router's own reader) started on `port`.
        self.router_pid, self.port = router_pid, port
        self.pid = pid
        self.pid_file = pid_file
        self.log_file = log_file if log_file and log_file != "-" else None
        # Reading llama-server's output from a pipe on this fd (`llama-server … 2>&1 | exporter --log-file -`).
        self.stdin_fd = 0 if stdin_fd is None and log_file == "-" else stdin_fd
        self.unit = unit  # the systemd unit whose journal is the log: its process is in that unit's cgroup
        self.self_pid = os.getpid() if self_pid is None else self_pid
        self._cached: tuple[int, int, str] | None = None  # (pid, start ticks, found_by) of the last auto match
        self._guessed: int | None = None  # the last pid taken by name only (said once in the log)
        # (pid, start ticks) of the process this reader found last, kept while none is found: gone with no
        # successor, it has exited.
        self._last_found: tuple[int, int] | None = None

    # ------------------------------------------------------------------ what a reader provides

    #: Where the processes were looked for, in messages ("under /proc", "among this host's processes").
    where: str = ""

    @abstractmethod
    def host_memory(self) -> tuple[HostMemory | None, str | None]:
        """The host's memory, or why it could not be read."""

    @abstractmethod
    def process(self, pid: int, found_by: str) -> tuple[ProcessInfo | None, str | None]:
        """The process `pid`; (None, None) when it is not running (gone, a zombie), (None, why) when unreadable."""

    @abstractmethod
    def start_ticks(self, pid: int) -> int | None:
        """The process's start identity (`ProcessInfo.start_ticks`), None when it is not running."""

    @abstractmethod
    def candidates(self, log_real: str | None, log_stat: tuple[int, int] | None) -> Iterator[Candidate]:
        """Every running process but the exporter; `names_log` filled in for the named ones (`names_log`)."""

    @abstractmethod
    def writes(self, c: Candidate, target: tuple[int, int]) -> bool | None:
        """Whether the process holds `target` (device, inode) open for writing; None if that cannot be told."""

    @abstractmethod
    def parent(self, pid: int) -> int | None:
        """The process's parent pid, None when unreadable."""

    @abstractmethod
    def wrapper_writes(self, pid: int, target: tuple[int, int]) -> bool:
        """Whether a wrapper process holds `target` open for writing (where the open mode is not known: at all)."""

    @abstractmethod
    def children(self, parent: int) -> Iterator[tuple[int, list[str]]]:
        """(pid, command line) of each child process of `parent`."""

    @abstractmethod
    def in_unit(self, unit: str) -> Iterator[tuple[int, int]]:
        """(start ticks, pid) of each llama-server in `unit`'s cgroup."""

    @abstractmethod
    def cwd(self, pid: int) -> str | None:
        """The process's working directory, None when unreadable."""

    def file_seen_by(self, pid: int, path: str) -> tuple[int, int] | None:
        """(device, inode) of `path` as the process sees it (its own mount namespace where the reader can)."""
        return file_id(path)

    # ------------------------------------------------------------------ reading

    def read(self) -> ProcSnapshot:
        """Find llama-server and read it and the host's memory. Never raises."""
        host, host_error = self.host_memory()
        try:
            pid, found_by, error = self._find()
            process = None
            if pid is not None:
                process, unreadable = self.process(pid, found_by)
                if process is None:
                    error = unreadable or f"llama-server pid {pid} ({found_by}) is not running"
                    self._cached = None
        except OSError as exc:  # an unexpected layout; never fail the scrape
            process, error = None, f"reading processes{self._where()}: {exc}"
        if host_error:
            error = f"{error}; {host_error}" if error else host_error
        if process is not None:
            self._last_found = (process.pid, process.start_ticks)
            return ProcSnapshot(process, host, error)
        return ProcSnapshot(process, host, error, self._exited())

    def _exited(self) -> int | None:
        """The pid of the process found last, if it no longer runs (its pid gone, or another process's now)."""
        if self._last_found is None:
            return None
        pid, ticks = self._last_found
        try:
            now = self.start_ticks(pid)
        except OSError:
            return None
        return pid if now is None or now != ticks else None

    def command_line(self, argv: list[str], environ: Mapping[str, str]) -> ServerCommandLine:
        """llama-server's settings from its command line and `LLAMA_*` environment."""
        return parse_command_line(argv, llama_environ(environ.items()))

    def names_log(
        self,
        pid: int,
        argv: list[str],
        environ: Mapping[str, str],
        log_real: str | None,
        log_stat: tuple[int, int] | None,
    ) -> bool | None:
        """Whether a named process's command line or environment names our log (`Candidate.names_log`)."""
        if self.log_file is None:
            return None
        cfg = self.command_line(argv, environ)
        return None if cfg.log_file is None else self._same_file(pid, cfg.log_file, log_real, log_stat)

    def _where(self) -> str:
        return f" {self.where}" if self.where else ""

    # ------------------------------------------------------------------ finding the pid

    def _find(self) -> tuple[int | None, str, str | None]:
        """(pid, how it was found, why none was found)."""
        if self.pid is not None:
            return self.pid, "pid", None
        if self.pid_file is not None:
            try:
                text = Path(self.pid_file).read_text(encoding="utf-8", errors="replace").strip()
            except OSError as exc:
                return None, "pid_file", f"--pid-file {self.pid_file}: {exc.strerror or exc}"
            if not text.isdigit():
                return None, "pid_file", f"--pid-file {self.pid_file}: expected a pid, got {text[:40]!r}"
            return int(text), "pid_file", None
        if self._cached is not None:
            pid, ticks, how = self._cached
            if self.start_ticks(pid) == ticks:
                return pid, how, None
            self._cached = None
        return self._scan()

    def _scan(self) -> tuple[int | None, str, str | None]:
        if self.router_pid is not None:
            return self._scan_child(self.router_pid(), self.port)
        if self.unit is not None:
            return self._scan_unit(self.unit)
        log_stat = self._target_stat()
        log_real = os.path.realpath(self.log_file) if self.log_file else None
        candidates = list(self.candidates(log_real, log_stat))
        # Newest first: if several servers ever named this log, the latest start truncated and owns it.
        newest_first = sorted(candidates, key=lambda c: c.start_ticks, reverse=True)
        match = next((c for c in newest_first if c.named and c.names_log), None)
        unknown: list[Candidate] = []  # named, but whether they write our log cannot be told
        if match is None and log_stat is not None:
            match, unknown = self._writer(newest_first, log_stat)
        elif log_stat is None and self.log_file is None and self.stdin_fd is None:
            # No log to compare with (a reader given neither a log file nor a unit): the only llama-server
            # is the best guess there is.
            unknown = [c for c in newest_first if c.named and c.names_log is None]
        # A log file that does not exist yet (or standard input that is not a pipe) is written by no
        # process: no llama-server is ours until one names it, whatever else runs on the host.
        if match is not None:
            self._cached = (match.pid, match.start_ticks, "log_file")
            return match.pid, "log_file", None
        # By name only when nothing better is possible: a server known to write another log is not ours.
        if len(unknown) == 1:
            return self._guess(unknown[0], log_stat)
        what = self.log_file or ("standard input" if self.stdin_fd is not None else "the log")
        if unknown:
            pids = ", ".join(str(c.pid) for c in sorted(unknown, key=lambda c: c.pid)[:8])
            return (
                None,
                "name",
                f"{len(unknown)} {SERVER_NAME} processes ({pids}) and none is known to write {what}; "
                "set --pid or --pid-file",
            )
        others = sum(c.named for c in candidates)
        where = f" writing {what}" if self.log_file or self.stdin_fd is not None else ""
        missing = " (it does not exist yet)" if self.log_file and log_stat is None else ""
        # Not how many: the reason would change, and be logged again, whenever another server starts or stops.
        also = f"; other {SERVER_NAME} processes run, not ours" if others else ""
        return None, "name", f"no {SERVER_NAME} process{where}{missing}{self._where()}{also}"

    def _writer(
        self, newest_first: list[Candidate], target: tuple[int, int]
    ) -> tuple[Candidate | None, list[Candidate]]:
        """The process writing `target`: a llama-server holding it; else a llama-server whose wrapper (its
        parent) writes it; else any process writing a log file (a renamed binary). With the llama-servers
        whose relation to it cannot be told."""
        named = [c for c in newest_first if c.named]
        unknown: list[Candidate] = []
        for c in named:
            writes = self.writes(c, target)
            if writes:
                return c, unknown
            if writes is None and c.names_log is None:
                unknown.append(c)
        if self.log_file is None:  # into a pipe: tee and cat write too, and a wrapper's pipe is not ours
            return None, unknown
        wrapped = next((c for c in named if c.names_log is not False and self._wrapped(c, target)), None)
        if wrapped is not None:
            return wrapped, unknown
        renamed = (c for c in newest_first if not c.named and self.writes(c, target))
        return next(renamed, None), unknown

    def _wrapped(self, c: Candidate, target: tuple[int, int]) -> bool:
        """Whether llama-server's parent, a wrapper that keeps its output (PowerShell's `2>`, a script piping it
        into a file), writes our log."""
        parent = self.parent(c.pid)
        return parent is not None and parent > 1 and parent != self.self_pid and self.wrapper_writes(parent, target)

    def _guess(self, c: Candidate, log_stat: tuple[int, int] | None) -> tuple[int, str, None]:
        self._cached = (c.pid, c.start_ticks, "name")
        if self._guessed != c.pid:
            self._guessed = c.pid
            logger.warning(
                "taking %s pid %d by its name only: whether it writes %s cannot be told (%s); if it is not "
                'this exporter\'s server, set --pid or --pid-file (llamacpp_process_found_by{how="name"})',
                SERVER_NAME,
                c.pid,
                self.log_file or "the log",
                "its open files are not readable to this user" if log_stat is not None else "no log to compare",
            )
        return c.pid, "name", None

    def _scan_child(self, router: int | None, port: int | None) -> tuple[int | None, str, str | None]:
        """The router's child process serving on `port` (its `--port` argument)."""
        if router is None:
            return None, "router", "the router's process is not known"
        for pid, argv in self.children(router):
            if port_of(argv) == str(port):
                ticks = self.start_ticks(pid)
                if ticks is not None:
                    self._cached = (pid, ticks, "router")
                    return pid, "router", None
        return None, "router", f"no child of router pid {router} serves port {port}"

    def _scan_unit(self, unit: str) -> tuple[int | None, str, str | None]:
        """The newest llama-server in `unit`'s cgroup (the journal source): never one by name alone."""
        unit = unit if "." in unit else f"{unit}.service"  # as `journalctl -u NAME` reads it
        found = list(self.in_unit(unit))
        if not found:
            return None, "unit", f"no {SERVER_NAME} process in the cgroup of {unit}{self._where()}"
        ticks, pid = max(found)
        self._cached = (pid, ticks, "unit")
        return pid, "unit", None

    def _target_stat(self) -> tuple[int, int] | None:
        """(device, inode) of what llama-server writes: the log file, or the pipe on our standard input."""
        if self.log_file:
            return file_id(self.log_file)
        if self.stdin_fd is not None:
            try:
                st = os.fstat(self.stdin_fd)
            except OSError:
                return None
            return (st.st_dev, st.st_ino) if stat.S_ISFIFO(st.st_mode) else None
        return None

    def _same_file(self, pid: int, path: str, log_real: str | None, log_stat: tuple[int, int] | None) -> bool | None:
        """Whether the process's `path` (relative to its cwd) is our log file; None when that cannot be told."""
        if not Path(path).is_absolute():
            cwd = self.cwd(pid)
            if cwd is None:
                return None  # another user's process, and the exporter may not look
            path = str(Path(cwd) / path)
        if log_real is not None and os.path.normcase(os.path.normpath(path)) == os.path.normcase(log_real):
            return True
        theirs = self.file_seen_by(pid, path)
        if log_stat is None:
            # Our log does not exist yet: a server whose own log exists writes another file. (Whether one
            # whose log cannot be seen is ours cannot be told.)
            return False if theirs is not None else None
        if theirs is not None:
            return theirs == log_stat
        return True if file_id(path) == log_stat else None
