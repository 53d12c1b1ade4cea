"""llama-server's process and the host's memory, from /proc (root injectable, like client_python's ProcessCollector).

`ProcReader.read()` finds llama-server's pid and returns an immutable `ProcSnapshot`: its RSS, start
time, command line settings (`server_cmdline`), and the host's MemAvailable/MemTotal. `ProcCollector`
renders the last snapshot.

Finding the pid, in this order:

1. `--pid N`, or `--pid-file PATH` (read at every scrape, so a restarted server is followed);
2. automatically: a process named `llama-server` that names the log file (`--log-file`,
   `LLAMA_ARG_LOG_FILE`, looked up in its own mount namespace) or holds it open for writing (compared
   by device and inode); then any process writing the log file (a renamed binary). With standard
   input (`llama-server … | llamacpp-exporter --log-file -`) the `llama-server` writing into that
   pipe. Last, by name: the only `llama-server` whose relation to the log cannot be told (its
   descriptors are unreadable to a non-root exporter, or it was given no log at all); one
   known to write another log is never taken. While our log file does not exist yet, no process
   writes it: only a server that names it is taken, whatever else runs on the host.
   A process taken by name is a guess: said once in the log, and `found_by` says "name".
   With the journal as the log (`unit`): the newest `llama-server` in that unit's cgroup
   (`/proc/<pid>/cgroup` ends in `/UNIT`), never one by name alone.
3. a router child (`router_pid`, `port`): the router's child process started with `--port PORT`.

The exporter itself, which has the log open for reading and `--log-file` on its own command line,
never matches. The found pid is kept while it lives with the same start time; only then is /proc
scanned again.
"""

from __future__ import annotations

import logging
import mmap
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from exporter.model.server_cmdline import ServerCommandLine, parse_command_line

logger = logging.getLogger(__name__)

SERVER_NAME = "llama-server"
_O_ACCMODE = 0o3


@dataclass(frozen=True)
class ProcessInfo:
    """llama-server's process as /proc shows it."""

    pid: int
    start_ticks: int  # field 22 of /proc/<pid>/stat: clock ticks after boot (identifies the process with pid)
    start_time_seconds: float | None  # Unix time
    rss_bytes: int
    command_line: ServerCommandLine
    found_by: str  # "pid", "pid_file", "log_file", "unit", "name"
    environ_readable: bool = True


@dataclass(frozen=True)
class HostMemory:
    """/proc/meminfo, in bytes."""

    total_bytes: int | None
    available_bytes: int | None


@dataclass(frozen=True)
class ProcSnapshot:
    """One read. `error` says why `process` (or `host`) is missing."""

    process: ProcessInfo | None = None
    host: HostMemory | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """llama-server and the host memory were both read."""
        return self.process is not None and self.host is not None and self.error is None


@dataclass(frozen=True)
class _Candidate:
    pid: int
    start_ticks: int
    named: bool
    # Whether its command line or environment names our log: True, False (names another file), None (cannot tell).
    names_log: bool | None


def _clock_ticks() -> int:
    """USER_HZ, the unit of /proc's start times: sysconf's where the system has it (not Windows), else
    Linux's fixed 100 (a /proc tree read from such a system is a Linux one)."""
    sysconf = getattr(os, "sysconf", None)
    return int(sysconf("SC_CLK_TCK")) if sysconf is not None else 100


def _read_bytes(path: Path) -> bytes:
    with path.open("rb") as f:
        return f.read()


def _parse_stat(raw: bytes) -> tuple[str, int, int]:
    """(state, starttime ticks, rss pages) from /proc/<pid>/stat; the comm field may hold spaces and ')'."""
    rest = raw[raw.rindex(b")") + 2 :].split()
    # rest[0] is field 3 (state); field N is rest[N - 3].
    return rest[0].decode(), int(rest[19]), int(rest[21])


class ProcReader:
    """Finds llama-server under a /proc root and reads it. Not thread-safe: one read at a time."""

    def __init__(
        self,
        proc_root: str | os.PathLike[str] = "/proc",
        *,
        pid: int | None = None,
        pid_file: str | None = None,
        log_file: str | None = None,
        stdin_fd: int | None = None,
        unit: str | None = None,
        self_pid: int | None = None,
        page_size: int | None = None,
        clock_ticks: int | None = None,
        router_pid: Callable[[], int | None] | None = None,
        port: int | None = None,
    ) -> None:
        self.root = Path(proc_root)
        # A router child: the process the router (its pid, from the router's own reader) started on `port`.
        self.router_pid, self.port = router_pid, port
        self.pid = pid
        self.pid_file = pid_file
        self.log_file = log_file if log_file and log_file != "-" else None
        # Reading llama-server's output from a pipe on this fd (`llama-server … 2>&1 | exporter --log-file -`).
        self.stdin_fd = 0 if stdin_fd is None and log_file == "-" else stdin_fd
        self.unit = unit  # the systemd unit whose journal is the log: its process is in that unit's cgroup
        self.self_pid = os.getpid() if self_pid is None else self_pid
        self.page_size = page_size or mmap.PAGESIZE
        self.clock_ticks = clock_ticks or _clock_ticks()
        self._cached: tuple[int, int, str] | None = None  # (pid, start ticks, found_by) of the last auto match
        self._guessed: int | None = None  # the last pid taken by name only (said once in the log)

    # ------------------------------------------------------------------ reading

    def read(self) -> ProcSnapshot:
        """Find llama-server and read it and the host's memory. Never raises."""
        host, host_error = self._host_memory()
        try:
            pid, found_by, error = self._find()
            process = None if pid is None else self._process(pid, found_by)
            if pid is not None and process is None:
                error = f"llama-server pid {pid} ({found_by}) is not running"
                self._cached = None
        except OSError as exc:  # an unexpected /proc layout; never fail the scrape
            process, error = None, f"reading {self.root}: {exc}"
        if host_error:
            error = f"{error}; {host_error}" if error else host_error
        return ProcSnapshot(process, host, error)

    def _host_memory(self) -> tuple[HostMemory | None, str | None]:
        try:
            text = _read_bytes(self.root / "meminfo").decode()
        except OSError as exc:
            return None, f"cannot read {self.root / 'meminfo'}: {exc.strerror or exc}"
        values: dict[str, int] = {}
        for line in text.splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if key in ("MemTotal", "MemAvailable") and parts and parts[0].isdigit():
                values[key] = int(parts[0]) * 1024  # always kB in /proc/meminfo
        return HostMemory(values.get("MemTotal"), values.get("MemAvailable")), None

    def _process(self, pid: int, found_by: str) -> ProcessInfo | None:
        base = self.root / str(pid)
        try:
            state, start_ticks, rss_pages = _parse_stat(_read_bytes(base / "stat"))
            argv = [a.decode(errors="replace") for a in _read_bytes(base / "cmdline").split(b"\0")]
        except (OSError, ValueError, IndexError):
            return None
        if state == "Z":
            return None  # exited, not yet reaped: it holds no memory and serves nothing
        if argv and argv[-1] == "":
            argv.pop()
        environ, environ_readable = self._environ(pid)
        return ProcessInfo(
            pid=pid,
            start_ticks=start_ticks,
            start_time_seconds=self._start_time(start_ticks),
            rss_bytes=rss_pages * self.page_size,
            command_line=parse_command_line(argv, environ),
            found_by=found_by,
            environ_readable=environ_readable,
        )

    def _environ(self, pid: int) -> tuple[dict[str, str], bool]:
        """The process environment; unreadable for another user's process unless the exporter runs as root."""
        try:
            raw = _read_bytes(self.root / str(pid) / "environ")
        except OSError:
            return {}, False
        env: dict[str, str] = {}
        for item in raw.split(b"\0"):
            key, sep, value = item.partition(b"=")
            if sep and key.startswith(b"LLAMA_"):
                env[key.decode(errors="replace")] = value.decode(errors="replace")
        return env, True

    def _start_time(self, start_ticks: int) -> float | None:
        try:
            for line in _read_bytes(self.root / "stat").decode().splitlines():
                if line.startswith("btime "):
                    return int(line.split()[1]) + start_ticks / self.clock_ticks
        except (OSError, ValueError, IndexError):
            pass
        return None

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
            if self._start_ticks(pid) == ticks:
                return pid, how, None
            self._cached = None
        return self._scan()

    def _start_ticks(self, pid: int) -> int | None:
        try:
            state, ticks, _ = _parse_stat(_read_bytes(self.root / str(pid) / "stat"))
        except (OSError, ValueError, IndexError):
            return None
        return None if state == "Z" else ticks

    def _scan(self) -> tuple[int | None, str, str | None]:
        if self.router_pid is not None:
            return self._scan_child(self.router_pid(), self.port)
        if self.unit is not None:
            return self._scan_unit(self.unit)
        log_stat = self._target_stat()
        log_real = os.path.realpath(self.log_file) if self.log_file else None
        candidates: list[_Candidate] = []
        for entry in os.scandir(self.root):
            if not entry.name.isdigit() or int(entry.name) == self.self_pid:
                continue
            c = self._candidate(int(entry.name), log_real, log_stat)
            if c is not None:
                candidates.append(c)
        # Newest first: if several servers ever named this log, the latest start truncated and owns it.
        newest_first = sorted(candidates, key=lambda c: c.start_ticks, reverse=True)
        match = next((c for c in newest_first if c.named and c.names_log), None)
        unknown: list[_Candidate] = []  # named, but whether they write our log cannot be told
        if match is None and log_stat is not None:
            ordered = [c for c in newest_first if c.named]
            if self.stdin_fd is None:  # a renamed binary may write a log file; into a pipe, tee and cat do
                ordered += [c for c in newest_first if not c.named]
            for c in ordered:
                writes = self._writes(c.pid, log_stat)
                if writes:
                    match = c
                    break
                if writes is None and c.named and c.names_log is None:
                    unknown.append(c)
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
            self._cached = (unknown[0].pid, unknown[0].start_ticks, "name")
            if self._guessed != unknown[0].pid:
                self._guessed = unknown[0].pid
                logger.warning(
                    "taking %s pid %d by its name only: whether it writes %s cannot be told (%s); if it is not "
                    'this exporter\'s server, set --pid or --pid-file (llamacpp_process_found_by{how="name"})',
                    SERVER_NAME,
                    unknown[0].pid,
                    self.log_file or "the log",
                    "its descriptors are not readable without root" if log_stat is not None else "no log to compare",
                )
            return unknown[0].pid, "name", None
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
        also = f"; {others} other {SERVER_NAME} process(es) run" if others else ""
        return None, "name", f"no {SERVER_NAME} process{where}{missing} under {self.root}{also}"

    def _scan_child(self, router: int | None, port: int | None) -> tuple[int | None, str, str | None]:
        """The router's child process serving on `port` (its `--port` argument)."""
        if router is None:
            return None, "router", "the router's process is not known"
        want = str(port).encode()
        for entry in os.scandir(self.root):
            if not entry.name.isdigit():
                continue
            try:
                raw = _read_bytes(self.root / entry.name / "stat")
                if int(raw[raw.rindex(b")") + 2 :].split()[1]) != router:
                    continue
                argv = _read_bytes(self.root / entry.name / "cmdline").split(b"\0")
            except (OSError, ValueError, IndexError):
                continue
            if any(a == b"--port" and i + 1 < len(argv) and argv[i + 1] == want for i, a in enumerate(argv)):
                pid = int(entry.name)
                ticks = self._start_ticks(pid)
                if ticks is not None:
                    self._cached = (pid, ticks, "router")
                    return pid, "router", None
        return None, "router", f"no child of router pid {router} serves port {port}"

    def _scan_unit(self, unit: str) -> tuple[int | None, str, str | None]:
        """The newest llama-server in `unit`'s cgroup (the journal source): never one by name alone."""
        unit = unit if "." in unit else f"{unit}.service"  # as `journalctl -u NAME` reads it
        found: list[tuple[int, int]] = []  # (start ticks, pid)
        for entry in os.scandir(self.root):
            if not entry.name.isdigit() or int(entry.name) == self.self_pid:
                continue
            c = self._candidate(int(entry.name), None, None)
            if c is None or not c.named:
                continue
            try:
                cgroups = _read_bytes(self.root / entry.name / "cgroup").decode(errors="replace")
            except OSError:
                continue
            # `0::/system.slice/llama-server.service` (v2), `1:name=systemd:/system.slice/…` (v1)
            if any(line.rpartition(":")[2].split("/")[-1] == unit for line in cgroups.splitlines()):
                found.append((c.start_ticks, c.pid))
        if not found:
            return None, "unit", f"no {SERVER_NAME} process in the cgroup of {unit} under {self.root}"
        ticks, pid = max(found)
        self._cached = (pid, ticks, "unit")
        return pid, "unit", None

    def _target_stat(self) -> tuple[int, int] | None:
        """(device, inode) of what llama-server writes: the log file, or the pipe on our standard input."""
        if self.log_file:
            return self._stat(self.log_file)
        if self.stdin_fd is not None:
            try:
                st = os.fstat(self.stdin_fd)
            except OSError:
                return None
            return (st.st_dev, st.st_ino) if stat.S_ISFIFO(st.st_mode) else None
        return None

    def _candidate(self, pid: int, log_real: str | None, log_stat: tuple[int, int] | None) -> _Candidate | None:
        base = self.root / str(pid)
        try:
            state, ticks, _ = _parse_stat(_read_bytes(base / "stat"))
            comm = _read_bytes(base / "comm").decode(errors="replace").strip()
            argv = [a.decode(errors="replace") for a in _read_bytes(base / "cmdline").split(b"\0") if a]
        except (OSError, ValueError, IndexError):
            return None  # gone meanwhile, or a kernel thread
        if state == "Z":
            return None
        exe = argv[0].rpartition("/")[2] if argv else ""
        named = SERVER_NAME in comm or SERVER_NAME in exe
        names_log: bool | None = None
        if named and self.log_file is not None:
            cfg = parse_command_line(argv, self._environ(pid)[0])
            if cfg.log_file is not None:
                names_log = self._same_file(pid, cfg.log_file, log_real, log_stat)
        return _Candidate(pid, ticks, named, names_log)

    def _same_file(self, pid: int, path: str, log_real: str | None, log_stat: tuple[int, int] | None) -> bool | None:
        """Whether the process's `path` (relative to its cwd) is our log file; None when that cannot be told.

        The path is looked up through /proc/<pid>/root, i.e. in the server's own mount namespace, so a
        log mounted elsewhere in the exporter's container still compares by device and inode.
        """
        if not path.startswith("/"):
            try:
                path = str((self.root / str(pid) / "cwd").readlink() / path)
            except OSError:
                return None  # another user's process, and the exporter is not root
        if os.path.normpath(path) == log_real:
            return True
        theirs = self._stat(self.root / str(pid) / "root" / path.lstrip("/"))
        if log_stat is None:
            # Our log does not exist yet: a server whose own log exists writes another file. (Whether one
            # whose log cannot be seen is ours cannot be told.)
            return False if theirs is not None else None
        if theirs is not None:
            return theirs == log_stat
        return True if self._stat(path) == log_stat else None

    def _writes(self, pid: int, target: tuple[int, int]) -> bool | None:
        """Whether the process holds `target` open for writing; None if its descriptors are unreadable."""
        fd_dir = self.root / str(pid) / "fd"
        try:
            fds = list(fd_dir.iterdir())
        except OSError:
            return None  # another user's process, and the exporter is not root
        for fd in fds:
            if self._stat(fd) != target:
                continue
            try:
                info = _read_bytes(self.root / str(pid) / "fdinfo" / fd.name).decode()
            except OSError:
                continue
            for line in info.splitlines():
                if line.startswith("flags:") and int(line.split()[1], 8) & _O_ACCMODE:
                    return True
        return False

    @staticmethod
    def _stat(path: str | Path) -> tuple[int, int] | None:
        try:
            st = Path(path).stat()
        except (OSError, ValueError):
            return None
        return st.st_dev, st.st_ino
