"""What the live sources read, as pure immutable data: the snapshots that `exporter.sources` produces at
each read and that `exporter.metrics` renders.

- `NvmlSnapshot` (`GpuReading` per GPU): free VRAM and the VRAM per process (`sources.nvml`);
- `ProcSnapshot` (`ProcessInfo`, `HostMemory`): llama-server's process and the host's memory
  (`sources.procfs` or `sources.psutil_reader`);
- `HttpSnapshot` (`LiveSlot` per entry of `/slots`): llama-server's `/health`, `/slots`, `/props` and
  `/metrics` (`sources.server_http`).

`parse_slots` is the one reading of a `/slots` answer, the exporter's (`sources.server_http`) and the
guard's (`guard.preempt`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from exporter.model.server_cmdline import ServerCommandLine

#: llama-server's endpoints read for a server, and for a router itself.
ENDPOINTS = ("/health", "/slots", "/props", "/metrics")
ROUTER_ENDPOINTS = ("/health", "/models")
#: How the process reader found llama-server's process (`ProcessInfo.found_by`).
FOUND_BY = ("pid", "pid_file", "log_file", "unit", "router", "name")
#: Where the slot tokens rendered come from: `/slots` (`n_prompt_tokens`), or the log's estimate.
SLOT_TOKEN_SOURCES = ("slots_endpoint", "log")


@dataclass(frozen=True)
class GpuReading:
    """One GPU: memory in bytes, and the VRAM each process uses on it (None = NVML cannot tell)."""

    index: int
    uuid: str
    name: str
    total_bytes: int
    used_bytes: int
    free_bytes: int
    # pid → bytes; None when the process list could not be read (e.g. not supported on this GPU).
    processes: dict[int, int | None] | None = field(default=None)
    # The rest: None where this GPU's NVML does not give it (WDDM GeForce, MIG, old drivers, no permission).
    utilization_ratio: float | None = None  # time a kernel ran over NVML's last sample period, 0-1
    memory_utilization_ratio: float | None = None  # time device memory was read or written, 0-1
    temperature_celsius: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None  # the enforced limit
    sm_clock_hertz: float | None = None
    clock_event_reasons: int | None = None  # NVML's bitmask of why the clocks are held down (throttling)
    xid_errors: int | None = None  # Xid critical errors seen since the exporter started; None: no events
    last_xid: int | None = None  # the code of the last one


@dataclass(frozen=True)
class NvmlSnapshot:
    """The result of one read. `error` is None when every GPU was read."""

    gpus: tuple[GpuReading, ...] = ()
    error: str | None = None

    @property
    def ok(self) -> bool:
        """The read worked and found at least one GPU."""
        return self.error is None and bool(self.gpus)


@dataclass(frozen=True)
class ProcessInfo:
    """llama-server's process as the reader saw it."""

    pid: int
    # Identifies the process together with its pid (a reused pid has another): /proc's start time in clock
    # ticks after boot (field 22 of /proc/<pid>/stat); psutil's creation time in milliseconds.
    start_ticks: int
    start_time_seconds: float | None  # Unix time
    rss_bytes: int
    command_line: ServerCommandLine
    found_by: str  # one of FOUND_BY
    environ_readable: bool = True


@dataclass(frozen=True)
class HostMemory:
    """The host's memory in bytes: MemTotal and MemAvailable (/proc/meminfo, or psutil's equivalents)."""

    total_bytes: int | None
    available_bytes: int | None


@dataclass(frozen=True)
class ProcSnapshot:
    """One read. `error` says why `process` (or `host`) is missing."""

    process: ProcessInfo | None = None
    host: HostMemory | None = None
    error: str | None = None
    #: The pid of the llama-server this reader had found, which has exited since, while no other has taken
    #: its place: the server is down (not merely unseen, as one in another container would be).
    exited: int | None = None

    @property
    def ok(self) -> bool:
        """llama-server and the host memory were both read."""
        return self.process is not None and self.host is not None and self.error is None


@dataclass(frozen=True)
class LiveSlot:
    """One entry of `/slots`. None = the build does not report it."""

    id: int
    n_ctx: int | None
    processing: bool | None
    tokens: int | None  # n_prompt_tokens
    n_decoded: int | None
    n_remain: int | None = None  # next_token.n_remain: generation budget left (-1 = unlimited or not started)
    n_predict: int | None = None  # params.n_predict (-1 = unlimited)
    n_cached: int | None = None  # n_prompt_tokens_cache (b9276+): the prompt's prefix reused from the cache
    task: int | None = None  # id_task: the slot's task (its last one while idle)
    # n_prompt_tokens_processed: the prompt's part read without the cache (whole once it generates; while it
    # reads, b11434's trails n_prompt_tokens by a batch)
    n_processed: int | None = None

    @property
    def generation_budget(self) -> int | None:
        """Tokens the slot may still generate; None when unknown or unlimited."""
        if self.n_remain is not None and self.n_remain >= 0:
            return self.n_remain
        if self.n_predict is not None and self.n_predict >= 0:
            return max(0, self.n_predict - (self.n_decoded or 0))
        return None


def json_int(value: object) -> int | None:
    """`value` if it is a JSON integer (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse_slots(body: object) -> tuple[LiveSlot, ...]:
    """Parse a `/slots` body; raises ValueError when it is not a list of slot objects. The one reading of
    `/slots`: the exporter's scrape (`sources.server_http`) and the guard's preemption (`guard.preempt`) both
    use it."""
    if not isinstance(body, list):
        raise ValueError("expected a JSON array")
    slots = []
    for i, item in enumerate(body):
        if not isinstance(item, dict):
            raise ValueError(f"entry {i} is not an object")
        processing = item.get("is_processing")
        if not isinstance(processing, bool):
            state = item.get("state")  # b2357-b4028: 0 idle, 1 busy
            processing = bool(state) if isinstance(state, int) else None
        next_token = item.get("next_token")
        if isinstance(next_token, list):  # b6890+: an array of one object
            next_token = next_token[0] if next_token else None
        n_decoded = json_int(next_token.get("n_decoded")) if isinstance(next_token, dict) else None
        n_remain = json_int(next_token.get("n_remain")) if isinstance(next_token, dict) else None
        params = item.get("params")
        n_predict = json_int((params if isinstance(params, dict) else item).get("n_predict"))
        slot_id = json_int(item.get("id"))
        tokens = json_int(item.get("n_prompt_tokens"))
        if tokens is None and "id_task" not in item and processing is False:
            tokens = 0  # b6890+ lists only id/n_ctx/is_processing for a slot that never had a task
        slots.append(
            LiveSlot(
                id=i if slot_id is None else slot_id,
                n_ctx=json_int(item.get("n_ctx")),
                processing=processing,
                tokens=tokens,
                n_decoded=n_decoded,
                n_remain=n_remain,
                n_predict=n_predict,
                n_cached=json_int(item.get("n_prompt_tokens_cache")),
                n_processed=json_int(item.get("n_prompt_tokens_processed")),
                task=json_int(item.get("id_task")),
            )
        )
    return tuple(slots)


@dataclass(frozen=True)
class HttpSnapshot:
    """The result of one read of the three endpoints."""

    up: bool = False
    loading: bool = False
    status: Mapping[str, int] = field(default_factory=dict)  # endpoint → HTTP status, 0 = no answer
    errors: Mapping[str, str] = field(default_factory=dict)  # endpoint → what went wrong
    slots: tuple[LiveSlot, ...] | None = None
    build: int | None = None
    total_slots: int | None = None
    n_ctx_slot: int | None = None
    model: str | None = None
    models: Mapping[str, str] | None = None  # router mode: model id → status (`loaded`, `unloaded`, …)
    deferred: int | None = None  # /metrics `llamacpp:requests_deferred`: requests waiting for a slot
    # Figures of /metrics (`METRICS_FIGURES`) this read did not understand → why (absent, not a count).
    rejected: Mapping[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """The server answered and every endpoint gave what it has (an endpoint that is off is fine)."""
        return (self.up or self.loading) and not self.errors

    @property
    def slot_tokens_live(self) -> bool:
        """`/slots` gave `n_prompt_tokens` for every slot."""
        return bool(self.slots) and all(s.tokens is not None for s in self.slots or ())

    def describe(self) -> str | None:
        """One line for the exporter's log, or None when all is well."""
        by_message: dict[str, list[str]] = {}
        for ep, msg in sorted(self.errors.items()):
            by_message.setdefault(msg, []).append(ep)
        return "; ".join(f"{', '.join(eps)}: {msg}" for msg, eps in by_message.items()) or None
