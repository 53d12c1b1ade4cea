"""llama-server's process and the host's memory, from /proc (root injectable, like client_python's ProcessCollector).

`ProcReader.read()` finds llama-server's pid by the rules of `exporter.sources.process` and returns an
immutable `ProcSnapshot`: its RSS, start time, command line settings (`server_cmdline`), and the host's
MemAvailable/MemTotal. `ProcCollector` renders the last snapshot.

What /proc adds to those rules: a process's log path is looked up in its own mount namespace
(`/proc/<pid>/root`), whether it writes a file is read from its descriptors' open flags
(`/proc/<pid>/fdinfo`), so a `tail -f` reader never matches, and a journal unit's process is the one whose
`/proc/<pid>/cgroup` ends in `/UNIT`. The exporter, which has the log open for reading and `--log-file` on
its own command line, never matches.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from exporter.model.live import HostMemory, ProcessInfo
from exporter.sources.process import Candidate, FinderArgs, ProcessFinder, file_id, is_server

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["ProcReader"]

_O_ACCMODE = 0o3


def _clock_ticks() -> int:
    """USER_HZ, the unit of /proc's start times: sysconf's where the system has it (not Windows), else
    Linux's fixed 100 (a /proc tree read from such a system is a Linux one)."""
    sysconf = getattr(os, "sysconf", None)
    return int(sysconf("SC_CLK_TCK")) if sysconf is not None else 100


def _read_bytes(path: Path) -> bytes:
    with path.open("rb") as f:
        return f.read()


def _parse_stat(raw: bytes) -> tuple[str, int, int, int]:
    """(state, ppid, starttime ticks, rss pages) from /proc/<pid>/stat; the comm field may hold spaces and ')'."""
    rest = raw[raw.rindex(b")") + 2 :].split()
    # rest[0] is field 3 (state); field N is rest[N - 3].
    return rest[0].decode(), int(rest[1]), int(rest[19]), int(rest[21])


def _argv(raw: bytes) -> list[str]:
    """/proc/<pid>/cmdline as a list; an empty argument (`--api-key ""`) is kept, the trailing NUL is not."""
    argv = [a.decode(errors="replace") for a in raw.split(b"\0")]
    if argv and argv[-1] == "":
        argv.pop()
    return argv


class ProcReader(ProcessFinder):
    """Finds llama-server under a /proc root and reads it. Not thread-safe: one read at a time."""

    def __init__(
        self,
        proc_root: str | os.PathLike[str] = "/proc",
        *,
        page_size: int | None = None,
        clock_ticks: int | None = None,
        **finder: Unpack[FinderArgs],
    ) -> None:
        super().__init__(**finder)
        self.root = Path(proc_root)
        self.where = f"under {self.root}"
        self._page_size, self._clock_ticks = page_size, clock_ticks

    @property
    def page_size(self) -> int:
        """The kernel's page size (RSS is counted in pages); asked for at the first read, not when built."""
        if self._page_size is None:
            self._page_size = mmap.PAGESIZE
        return self._page_size

    @property
    def clock_ticks(self) -> int:
        """Clock ticks per second (start times are counted in ticks after boot)."""
        if self._clock_ticks is None:
            self._clock_ticks = _clock_ticks()
        return self._clock_ticks

    # ------------------------------------------------------------------ reading

    def host_memory(self) -> tuple[HostMemory | None, str | None]:
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

    def process(self, pid: int, found_by: str) -> tuple[ProcessInfo | None, str | None]:
        base = self.root / str(pid)
        try:
            state, _, start_ticks, rss_pages = _parse_stat(_read_bytes(base / "stat"))
            argv = _argv(_read_bytes(base / "cmdline"))
        except (OSError, ValueError, IndexError):
            return None, None
        if state == "Z":
            return None, None  # exited, not yet reaped: it holds no memory and serves nothing
        environ, environ_readable = self._environ(pid)
        info = ProcessInfo(
            pid=pid,
            start_ticks=start_ticks,
            start_time_seconds=self._start_time(start_ticks),
            rss_bytes=self._resident_pages(pid, rss_pages) * self.page_size,
            command_line=self.command_line(argv, environ),
            found_by=found_by,
            environ_readable=environ_readable,
        )
        return info, None

    def _resident_pages(self, pid: int, approximate: int) -> int:
        """Resident pages from /proc/<pid>/statm, the exact sum (as `VmRSS` and psutil count them); the
        `stat` figure is the kernel's per-CPU estimate, a few hundred KiB low on a busy server."""
        try:
            return int(_read_bytes(self.root / str(pid) / "statm").split()[1])
        except (OSError, ValueError, IndexError):
            return approximate

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

    # ------------------------------------------------------------------ seeing processes

    def start_ticks(self, pid: int) -> int | None:
        try:
            state, _, ticks, _ = _parse_stat(_read_bytes(self.root / str(pid) / "stat"))
        except (OSError, ValueError, IndexError):
            return None
        return None if state == "Z" else ticks

    def _pids(self) -> Iterator[int]:
        for entry in os.scandir(self.root):
            if entry.name.isdigit() and int(entry.name) != self.self_pid:
                yield int(entry.name)

    def candidates(self, log_real: str | None, log_stat: tuple[int, int] | None) -> Iterator[Candidate]:
        for pid in self._pids():
            base = self.root / str(pid)
            try:
                state, _, ticks, _ = _parse_stat(_read_bytes(base / "stat"))
                comm = _read_bytes(base / "comm").decode(errors="replace").strip()
                argv = _argv(_read_bytes(base / "cmdline"))
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile, or a kernel thread
            if state == "Z":
                continue
            named = is_server(comm, argv)
            names_log = self.names_log(pid, argv, self._environ(pid)[0], log_real, log_stat) if named else None
            yield Candidate(pid, ticks, named, names_log)

    def children(self, parent: int) -> Iterator[tuple[int, list[str]]]:
        for entry in os.scandir(self.root):
            if not entry.name.isdigit():
                continue
            try:
                if _parse_stat(_read_bytes(self.root / entry.name / "stat"))[1] != parent:
                    continue
                yield int(entry.name), _argv(_read_bytes(self.root / entry.name / "cmdline"))
            except (OSError, ValueError, IndexError):
                continue

    def in_unit(self, unit: str) -> Iterator[tuple[int, int]]:
        for c in self.candidates(None, None):
            if not c.named:
                continue
            try:
                cgroups = _read_bytes(self.root / str(c.pid) / "cgroup").decode(errors="replace")
            except OSError:
                continue
            # `0::/system.slice/llama-server.service` (v2), `1:name=systemd:/system.slice/…` (v1)
            if any(line.rpartition(":")[2].split("/")[-1] == unit for line in cgroups.splitlines()):
                yield c.start_ticks, c.pid

    def cwd(self, pid: int) -> str | None:
        try:
            return str((self.root / str(pid) / "cwd").readlink())
        except OSError:
            return None  # another user's process, and the exporter is not root

    def file_seen_by(self, pid: int, path: str) -> tuple[int, int] | None:
        """Looked up through /proc/<pid>/root, i.e. in the server's own mount namespace, so a log mounted
        elsewhere in the exporter's container still compares by device and inode."""
        return file_id(self.root / str(pid) / "root" / path.lstrip("/"))

    def parent(self, pid: int) -> int | None:
        try:
            return _parse_stat(_read_bytes(self.root / str(pid) / "stat"))[1]
        except (OSError, ValueError, IndexError):
            return None

    def wrapper_writes(self, pid: int, target: tuple[int, int]) -> bool:
        return self._writes(pid, target) is True

    def writes(self, c: Candidate, target: tuple[int, int]) -> bool | None:
        return self._writes(c.pid, target)

    def _writes(self, pid: int, target: tuple[int, int]) -> bool | None:
        fd_dir = self.root / str(pid) / "fd"
        try:
            fds = list(fd_dir.iterdir())
        except FileNotFoundError:
            return False  # it exited since it was listed: it writes nothing
        except OSError:
            return None  # another user's process, and the exporter is not root
        for fd in fds:
            if file_id(fd) != target:
                continue
            try:
                info = _read_bytes(self.root / str(pid) / "fdinfo" / fd.name).decode()
            except OSError:
                continue
            for line in info.splitlines():
                if line.startswith("flags:") and int(line.split()[1], 8) & _O_ACCMODE:
                    return True
        return False
