"""The systemd journal of a unit as the log source: ``--log-source journald --journal-unit llama-server.service``.

Under systemd llama-server usually logs to standard error, and the journal keeps it. This source runs
the real ``journalctl`` (no libsystemd binding needed) in two steps, so that no line is lost or read
twice between them, and so that restarts behave exactly like the file source:

1. **History.** ``journalctl -u UNIT -o json --reverse`` is read from the newest entry backwards until
   the start banner of the newest llama-server process (`initializing ...`, `build …`, `verbosity = …`)
   and the rest of that process's lines (same ``_PID``). Those lines, in order, are the journal's
   equivalent of the file source's existing log: the pipeline applies them with counting off, so
   slots, pool and configuration come back and no past event is counted again. The newest entry's
   ``__CURSOR`` is kept.
2. **Follow.** ``journalctl -u UNIT -o json -f --after-cursor=CURSOR`` continues right after that
   entry. Every entry's cursor is remembered; if journalctl exits (journal rotated away, killed), it is
   restarted after the last cursor seen.

The journal is never truncated, so a restart of llama-server shows only as its new start banner; the
server state counts one start per banner (as it does for the file source, where a truncated file is
followed by the same banner). ``-o json`` rather than ``-o cat``: it carries the cursor and ``_PID`` of
every entry, and a message with control bytes (colour codes) arrives as a byte array instead of
being mangled.

Sample entry (``--output-fields=MESSAGE,_PID``; journalctl always adds the cursor and timestamps)::

    {"__CURSOR":"s=8eea…;i=16;…","_PID":"4242","MESSAGE":"srv  update_slots: all slots are idle", …}
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from exporter.logs import events as ev
from exporter.logs.parse import parse_line
from exporter.logs.source import CHUNK_BYTES, StreamSource, read_lines

log = logging.getLogger(__name__)

#: Fields asked of journalctl (it always adds __CURSOR, __REALTIME_TIMESTAMP, __MONOTONIC_TIMESTAMP, _BOOT_ID).
OUTPUT_FIELDS = "MESSAGE,_PID"
#: At most this many entries are replayed at start (a unit that logged without a start banner for ages).
MAX_HISTORY_ENTRIES = 1_000_000
#: Longest JSON line accepted from journalctl (journald itself splits lines at 48 KiB by default).
MAX_JSON_LINE = 8 << 20


@dataclass(frozen=True)
class JournalEntry:
    """One journal entry as far as this source cares."""

    cursor: str | None
    pid: str | None
    lines: list[str]
    realtime: float | None = None  # when it was logged (epoch seconds; the entry's __REALTIME_TIMESTAMP)


def _field_text(value: object) -> str | None:
    """A journal field in journalctl's JSON: a string, a byte array (control or non-UTF-8 bytes), or a
    list of those when the field occurs more than once (the first is taken)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value:
        if all(isinstance(b, int) for b in value):
            return bytes(b & 0xFF for b in value).decode("utf-8", errors="replace")
        return _field_text(value[0])
    return None


def parse_entry(raw: bytes | str) -> JournalEntry | None:
    """Decode one line of ``journalctl -o json`` output; None for anything that is not an entry.

    >>> parse_entry('{"__CURSOR":"s=1;i=2","_PID":"7","MESSAGE":"srv  load_model: loading model"}')
    JournalEntry(cursor='s=1;i=2', pid='7', lines=['srv  load_model: loading model'], realtime=None)
    """
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: "[[[[…" nested deeper than Python recurses
        return None
    if not isinstance(obj, dict):
        return None
    cursor = obj.get("__CURSOR")
    message = _field_text(obj.get("MESSAGE"))
    realtime = _field_text(obj.get("__REALTIME_TIMESTAMP"))
    return JournalEntry(
        cursor=cursor if isinstance(cursor, str) else None,
        pid=_field_text(obj.get("_PID")),
        lines=message_lines(message) if message is not None else [],
        realtime=realtime_seconds(realtime),
    )


def message_lines(message: str) -> list[str]:
    """A journal message's lines, split at "\\n" only, as a log file is: str.splitlines() also splits at
    U+2028, \\x1c and the like, which a client can put in a prompt to forge a line of its own."""
    lines = message.split("\n")
    if len(lines) > 1 and not lines[-1]:
        lines.pop()
    return lines


#: Wall-clock times outside 1970-2200 are taken for garbage (a forged or corrupt field), not dates.
LATEST_WALL_CLOCK = 7_258_118_400.0


def realtime_seconds(value: str | bytes | None) -> float | None:
    """A journal `__REALTIME_TIMESTAMP` (µs since 1970) in seconds; None unless it is a plausible date."""
    if not value or len(value) > 19 or not value.isdigit() or not value.isascii():
        return None
    seconds = int(value) / 1e6
    return seconds if 0 < seconds < LATEST_WALL_CLOCK else None


def is_start_banner(line: str) -> bool:
    """True for the lines llama-server prints when it starts (what the state counts as a start)."""
    return type(parse_line(line)) in ev.BANNERS


class JournaldSource(StreamSource):
    """Lines of one systemd unit's journal, via ``journalctl``; it logs its own problems."""

    def __init__(
        self,
        unit: str,
        *,
        namespace: str | None = None,
        directory: str | None = None,
        journalctl: str = "journalctl",
        restart_delay: float = 1.0,
        max_history: int = MAX_HISTORY_ENTRIES,
    ) -> None:
        super().__init__()
        self.unit = unit
        self.namespace = namespace
        self.directory = directory
        self.journalctl = journalctl
        self.restart_delay = restart_delay
        self.max_history = max_history
        self.cursor: str | None = None
        self.history_entries = 0
        self.restarts = 0
        self._history_ok = False
        self._up = False
        self._reported: str | None = None

    # -- LineSource ----------------------------------------------------------------------------
    @property
    def description(self) -> str:
        where = f" (namespace {self.namespace})" if self.namespace else ""
        where += f" (directory {self.directory})" if self.directory else ""
        return f"journal of {self.unit}{where}"

    @property
    def up(self) -> bool:
        return self._up

    def command(self, *extra: str) -> list[str]:
        """The journalctl argv for this unit, with ``extra`` options appended."""
        cmd = [
            self.journalctl,
            "--no-pager",
            "--quiet",
            "--output=json",
            "--all",  # without it, fields over 4096 bytes come back as null
            f"--output-fields={OUTPUT_FIELDS}",
            f"--unit={self.unit}",
        ]
        if self.namespace:
            cmd.append(f"--namespace={self.namespace}")
        if self.directory:
            cmd.append(f"--directory={self.directory}")
        return [*cmd, *extra]

    def history(self) -> list[str]:
        """Lines of the newest llama-server process in the journal (back to its start banner), in order."""
        cmd = self.command("--reverse")
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as exc:
            self._report(f"--log-source journald: cannot run {self.journalctl}: {exc.strerror or exc}")
            return []
        newest: list[list[str]] = []
        banner_pid: str | None = None
        seen_banner = False
        complete = True
        try:
            assert proc.stdout is not None
            for raw in proc.stdout:
                entry = parse_entry(raw)
                if entry is None:
                    continue
                if self.cursor is None:
                    self.cursor = entry.cursor
                if seen_banner and (entry.pid != banner_pid or (banner_pid is None and not self._banner(entry))):
                    complete = False  # older than the newest start: not needed
                    break
                newest.append(entry.lines)
                if self._banner(entry):
                    seen_banner, banner_pid = True, entry.pid
                if len(newest) >= self.max_history:
                    complete = False
                    log.warning(
                        "journal of %s: no llama-server start banner in the last %d entries; replaying only those",
                        self.unit,
                        self.max_history,
                    )
                    break
        finally:
            if proc.poll() is None:
                proc.kill()
            _, err = proc.communicate()
        if complete and proc.returncode != 0:
            message = err.decode(errors="replace").strip() or f"exit status {proc.returncode}"
            self._report(f"journal of {self.unit}: {' '.join(cmd)}: {message}")
            self.cursor = None
            return []
        self._history_ok = True
        self._up = True
        self._report(None)
        self.history_entries = len(newest)
        return [line for lines in reversed(newest) for line in lines]

    async def run(self, on_lines: Callable[[list[str]], None], stop: asyncio.Event) -> None:
        """Follow the journal after the history until `stop` is set; restart journalctl if it exits."""
        stop_task: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                await self._follow_once(on_lines, stop)
                if stop.is_set():
                    break
                self._up = False
                self.restarts += 1
                await asyncio.wait({stop_task}, timeout=self.restart_delay)
        finally:
            stop_task.cancel()
            self._up = False

    # -- internals -----------------------------------------------------------------------------
    @staticmethod
    def _banner(entry: JournalEntry) -> bool:
        return any(is_start_banner(line) for line in entry.lines)

    def _follow_args(self) -> Sequence[str]:
        if self.cursor is not None:
            return ("--follow", "--no-tail", f"--after-cursor={self.cursor}")
        if self._history_ok:
            # The unit had no entries at all when the history was read: whatever is there now is new.
            return ("--follow", "--no-tail")
        # The history could not be read: do not count the unit's whole past as live events.
        return ("--follow", "--lines=0")

    async def _follow_once(self, on_lines: Callable[[list[str]], None], stop: asyncio.Event) -> None:
        cmd = self.command(*self._follow_args())
        try:
            proc = await asyncio.create_subprocess_exec(
                *cmd,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            self._report(f"--log-source journald: cannot run {self.journalctl}: {exc.strerror or exc}")
            return
        assert proc.stdout is not None and proc.stderr is not None
        stdout = proc.stdout
        stderr_task = asyncio.ensure_future(proc.stderr.read())
        self._up = True

        def entries(raws: list[bytes]) -> None:
            """A read's entries: their lines to the pipeline as one batch, the last cursor kept."""
            lines: list[str] = []
            read = False
            for raw in raws:
                entry = parse_entry(raw)
                if entry is None:
                    continue
                read = True
                if entry.cursor is not None:
                    self.cursor = entry.cursor
                lines += entry.lines
            if read and self._reported is not None:
                self._report(None)
            if lines:
                on_lines(lines)

        try:
            await read_lines(lambda: stdout.read(CHUNK_BYTES), entries, stop, max_line=MAX_JSON_LINE)
        finally:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.wait(), timeout=5)
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
            err = b""
            with contextlib.suppress(Exception):
                err = await asyncio.wait_for(stderr_task, timeout=1)
        if not stop.is_set():
            detail = err.decode(errors="replace").strip() or f"exit status {proc.returncode}"
            self._report(f"journal of {self.unit}: journalctl stopped ({detail}); restarting after the last entry read")

    def _report(self, error: str | None) -> None:
        """Log a problem once when it appears and once when it clears."""
        if error != self._reported:
            if error:
                log.warning("%s", error)
            elif self._reported:
                log.info("journal of %s is readable again", self.unit)
            self._reported = error
