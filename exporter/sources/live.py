"""Live sources read at scrape time (NVML, /proc, llama-server's HTTP endpoints), and how they meet the log.

`LiveSources.refresh()` is the web app's `before_scrape`: it reads the three sources concurrently,
each bounded by one short timeout (a slow server or a hung driver never holds a scrape near
Prometheus' 10 s limit), and keeps the last snapshot of each. /proc and NVML reads run in a worker
thread because a full /proc scan (when llama-server is not running) and NVML calls on a failing
GPU can block; a read still running when the next scrape comes is awaited, not started twice.

What the sources tell the log-derived `ServerState` is applied on the event loop, never from a
thread: the process identity (a new pid is a server start, counted once with the log's banner) and
the command line (a pool-capacity fallback). What the collectors render is made from the state and the
last snapshots once per scrape (`exporter.model.view`): `/slots` replaces the log's per-slot estimate when
it has `n_prompt_tokens`, and gaps the log leaves at default verbosity are filled from `/props` and the
command line, in a copy. The state itself stays pure.

Every failure is a value: `llamacpp_exporter_source_up{source} 0`, a failed-reads counter, and one
line in the exporter's log when a source goes down, changes its reason, or comes back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from exporter.model.live import HttpSnapshot, NvmlSnapshot, ProcSnapshot
from exporter.model.state import ServerState
from exporter.model.view import SourceReading, effective_verbosity, merge_view
from exporter.sources.nvml import NvmlReader
from exporter.sources.process import ProcessFinder
from exporter.sources.server_http import METRICS_FIGURES, ServerHttpReader

log = logging.getLogger(__name__)

#: Below this llama-server verbosity (b9151+) the lines the exporter needs most are hidden.
FULL_VERBOSITY = 4
_VERBOSITY_LINE_SINCE = 9151  # b9151 moved library INFO and many server lines to trace level


_T = TypeVar("_T")
_T_co = TypeVar("_T_co", covariant=True)


@dataclass
class SourceStatus:
    """Health of one live source: up, last read duration, failed reads, last error."""

    up: bool = False
    name: str = ""
    duration_seconds: float | None = None
    failures: int = 0
    error: str | None = None
    _reported: str | None = None
    _ever_read: bool = False

    def record(self, ok: bool, duration: float, error: str | None) -> None:
        """Store a read's result and log once per change (down, new reason, recovered)."""
        self.up, self.duration_seconds = ok, duration
        self.error = None if ok else (error or "read failed")
        if not ok:
            self.failures += 1
        if self.error != self._reported:
            if self.error is not None:
                log.warning("source %s down: %s", self.name, self.error)
            elif self._ever_read:
                log.info("source %s is up again", self.name)
            self._reported = self.error
        self._ever_read = True


class _Coalesced(Generic[_T_co]):
    """At most one read in flight; a scrape that finds one running waits for it instead of starting another."""

    def __init__(self, start: Callable[[], Awaitable[_T_co]]) -> None:
        self._start = start
        self._task: asyncio.Future[_T_co] | None = None

    async def get(self, timeout: float) -> _T_co:
        """The result of the read in flight (or a new one); raises TimeoutError after `timeout` (the read goes on)."""
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._start())
        return await asyncio.wait_for(asyncio.shield(self._task), timeout)

    async def cancel(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            # A cancelled or failed read at shutdown is of no interest.
            with contextlib.suppress(BaseException):
                await self._task


def _in_thread(fn: Callable[[], _T]) -> Callable[[], Awaitable[_T]]:
    return lambda: asyncio.to_thread(fn)


class LiveSources:
    """The live readers (each optional), their last snapshots and health, and the merged view for the collectors."""

    def __init__(
        self,
        state: ServerState,
        *,
        nvml: NvmlReader | None = None,
        proc: ProcessFinder | None = None,
        http: ServerHttpReader | None = None,
        timeout: float = 2.0,
        http_gate: Callable[[], tuple[str, bool] | None] | None = None,
        unit: str = "",
    ) -> None:
        self.state = state
        self.unit = unit  # which server, in the exporter's log lines ("" for the only one)
        # A router child: (why not, loading) while its model is not loaded; its endpoints are then not read.
        self.http_gate = http_gate
        self.nvml_reader, self.proc_reader, self.http_reader = nvml, proc, http
        self.timeout = timeout
        self.statuses: dict[str, SourceStatus] = {
            name: SourceStatus(name=f"{name} of {unit}" if unit else name)
            for name, reader in (("nvml", nvml), ("proc", proc), ("http", http))
            if reader is not None
        }
        self.nvml: NvmlSnapshot | None = None
        self.proc: ProcSnapshot | None = None
        self.http: HttpSnapshot | None = None
        # Reads of llama-server's /metrics whose figure was absent or not a count, by figure (a fixed set).
        self.http_rejected: dict[str, int] = dict.fromkeys(METRICS_FIGURES, 0) if http else {}
        self._rejected_reported: dict[str, str] = {}
        self._nvml_read = _Coalesced(_in_thread(nvml.read)) if nvml else None
        self._proc_read = _Coalesced(_in_thread(proc.read)) if proc else None
        self._http_read = _Coalesced(http.read) if http else None
        self._verbosity_reported: tuple[int, bool] | None = None
        self._environ_reported: int | None = None  # the pid whose unreadable environment was said

    # ------------------------------------------------------------------ reading

    async def refresh(self) -> None:
        """Read every enabled source concurrently and apply what they say to the state. Never raises."""
        await asyncio.gather(self._refresh_proc(), self._refresh_nvml(), self._refresh_http())
        self.report_verbosity()

    async def _read(self, name: str, reader: _Coalesced[_T]) -> tuple[_T | None, float, str | None]:
        started = time.perf_counter()
        result: _T | None = None
        error: str | None = None
        try:
            result = await reader.get(self.timeout)
        except (asyncio.TimeoutError, TimeoutError):
            error = f"no result within {self.timeout:g}s (--server-timeout)"
        except Exception as exc:  # a reader bug must not fail the scrape
            log.debug("source %s read failed", name, exc_info=True)
            error = f"{type(exc).__name__}: {exc}"
        return result, time.perf_counter() - started, error

    async def _refresh_proc(self) -> None:
        if self._proc_read is None:
            return
        snap, took, error = await self._read("proc", self._proc_read)
        if snap is not None:
            self.proc = snap
            p = snap.process
            if p is not None:  # while none runs, the last server's command line stays, like its log state
                self.state.observe_process(p.pid, p.start_ticks)
                self.state.apply_command_line(p.command_line)
                if not p.environ_readable and self._environ_reported != p.pid:
                    self._environ_reported = p.pid
                    log.warning(
                        "%sllama-server pid %d: its environment is not readable to this user, so LLAMA_ARG_* "
                        "settings are not seen (only its command line); run the exporter as llama-server's user",
                        f"{self.unit}: " if self.unit else "",
                        p.pid,
                    )
        ok = snap is not None and snap.ok
        self.statuses["proc"].record(ok, took, error or (snap.error if snap else None))

    async def _refresh_nvml(self) -> None:
        if self._nvml_read is None:
            return
        snap, took, error = await self._read("nvml", self._nvml_read)
        self.nvml = snap if snap is not None else NvmlSnapshot(error=error)
        self.statuses["nvml"].record(self.nvml.ok, took, error or self.nvml.error)

    async def _refresh_http(self) -> None:
        if self._http_read is None:
            return
        closed = self.http_gate() if self.http_gate is not None else None
        if closed is not None:
            why, loading = closed
            self.http = HttpSnapshot(loading=loading, errors={} if loading else {"/health": why})
            self.statuses["http"].record(loading, 0.0, why)
            return
        snap, took, error = await self._read("http", self._http_read)
        self.http = snap if snap is not None else HttpSnapshot(errors={"*": error or "read failed"})
        self.statuses["http"].record(self.http.ok, took, error or self.http.describe())
        if snap is not None and snap.up and snap.status.get("/metrics") == 200:  # a /metrics body was read
            self._count_rejected(snap.rejected)

    def _count_rejected(self, rejected: Mapping[str, str]) -> None:
        """Count the figures of /metrics this read did not understand; say so once per change of why."""
        for figure in METRICS_FIGURES:
            why = rejected.get(figure)
            if why is not None:
                self.http_rejected[figure] += 1
            if why != self._rejected_reported.get(figure):
                where = f"{self.unit}: " if self.unit else ""
                if why is not None:
                    log.warning(
                        "%sllama-server's /metrics: %s %s; left out until it is a count again "
                        "(llamacpp_exporter_http_values_rejected_total)",
                        where,
                        figure,
                        why,
                    )
                else:
                    log.info("%sllama-server's /metrics: %s read again", where, figure)
            if why is None:
                self._rejected_reported.pop(figure, None)
            else:
                self._rejected_reported[figure] = why

    async def close(self) -> None:
        """Stop reads in flight, close the HTTP session and shut NVML down."""
        for reader in (self._nvml_read, self._proc_read, self._http_read):
            if reader is not None:
                await reader.cancel()
        if self.http_reader is not None:
            await self.http_reader.close()
        if self.nvml_reader is not None:
            self.nvml_reader.close()

    # ------------------------------------------------------------------ what the collectors see

    @property
    def pid(self) -> int | None:
        """llama-server's pid from the last /proc read."""
        p = self.proc.process if self.proc is not None else None
        return p.pid if p is not None else None

    def readings(self) -> dict[str, SourceReading]:
        """Each source's health as of its last read, by name (`http`, `nvml`, `proc`), for the scrape's view."""
        return {
            name: SourceReading(st.up, st.duration_seconds, st.failures, st.error) for name, st in self.statuses.items()
        }

    def report_verbosity(self) -> None:
        """Say once (per change) in the exporter's log when llama-server's verbosity hides lines it needs."""
        level = effective_verbosity(self.state)
        if level is None:
            return
        build = self.state.run.build or (self.http.build if self.http else None)
        hidden = level < FULL_VERBOSITY and (build is None or build >= _VERBOSITY_LINE_SINCE)
        if (level, hidden) == self._verbosity_reported:
            return
        self._verbosity_reported = (level, hidden)
        if hidden:
            capacity, source = merge_view(self.state, self.http).pool_capacity()
            log.warning(
                "%sllama-server logs at verbosity %d (< %d): the KV pool size (llama_context/llama_kv_cache), "
                "'new prompt'/'cached n_tokens', 'clearing prompt', context checkpoint and prompt cache lines "
                "are hidden. Pool capacity %s (from %s); slot tokens from %s. Start llama-server with -lv 4 "
                "for the full picture (llamacpp_log_verbosity).",
                f"{self.unit}: " if self.unit else "",
                level,
                FULL_VERBOSITY,
                capacity if capacity is not None else "unknown",
                source,
                "/slots" if self.http is not None and self.http.slot_tokens_live else "log estimates",
            )
