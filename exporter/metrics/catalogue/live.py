"""The families of the live sources (NVML, the process and the host, llama-server's HTTP endpoints), of the
exporter's own health, and of a router's children."""

from __future__ import annotations

from exporter.metrics.catalogue.family import GPU, HOST, ROUTER, SERVER, Family
from exporter.model.live import ENDPOINTS, FOUND_BY, ROUTER_ENDPOINTS, SLOT_TOKEN_SOURCES
from exporter.model.router import EXIT_OUTCOMES

#: The live sources; `llamacpp_exporter_source_up` has the log's too.
LIVE_SOURCES = ("http", "nvml", "proc")
SOURCES = ("log", *LIVE_SOURCES)
#: NVML's clock event (throttle) reason bits and their `reason` label; a bit not listed is `other`.
THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x001, "gpu_idle"),
    (0x002, "applications_clocks_setting"),
    (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal_slowdown"),
    (0x040, "hw_thermal_slowdown"),
    (0x080, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)


# --------------------- the live sources' read health, where slot tokens came from (metrics/live.py)

SLOT_TOKENS_SOURCE = Family(
    "llamacpp_slot_tokens_source",
    "gauge",
    SERVER,
    "Where llamacpp_slot_tokens comes from: 1 for the source in use (slots_endpoint = /slots n_prompt_tokens, log "
    "= estimated from the log).",
    labels=("source",),
    values={"source": SLOT_TOKEN_SOURCES},
)

LOG_VERBOSITY = Family(
    "llamacpp_log_verbosity",
    "gauge",
    SERVER,
    "llama-server's log verbosity (-lv); below 4 the KV pool size, new prompt, clearing, checkpoint and prompt "
    "cache lines are hidden (b9151+) and estimated.",
)

EXPORTER_SOURCE_READ_DURATION_SECONDS = Family(
    "llamacpp_exporter_source_read_duration_seconds",
    "gauge",
    SERVER,
    "Duration of the last read of the live source (seconds).",
    labels=("source",),
    values={"source": LIVE_SOURCES},
)

EXPORTER_SOURCE_READ_FAILURES = Family(
    "llamacpp_exporter_source_read_failures_total",
    "counter",
    SERVER,
    "Reads of the live source that failed (see the exporter's log for why).",
    labels=("source",),
    values={"source": LIVE_SOURCES},
)


# ------------------------------------------- the exporter's own health (metrics/exporter_health.py)

EXPORTER_SOURCE_UP = Family(
    "llamacpp_exporter_source_up",
    "gauge",
    SERVER,
    "1 when the last read of the source worked.",
    labels=("source",),
    values={"source": SOURCES},
)

EXPORTER_LOG_LINES = Family(
    "llamacpp_exporter_log_lines_total",
    "counter",
    SERVER,
    "Log lines read while running (not counting the start-up replay).",
)

EXPORTER_LOG_REPLAYED_LINES = Family(
    "llamacpp_exporter_log_replayed_lines",
    "gauge",
    SERVER,
    "Lines of the existing log replayed at start to rebuild gauges (not counted as events).",
)

EXPORTER_LOG_TRUNCATIONS = Family(
    "llamacpp_exporter_log_truncations_total", "counter", SERVER, "Times the log file shrank or was rewritten in place."
)

EXPORTER_LOG_ROTATIONS = Family(
    "llamacpp_exporter_log_rotations_total",
    "counter",
    SERVER,
    "Times the log path named a new file (rotation, re-creation).",
)

EXPORTER_LOG_LOST_BYTES = Family(
    "llamacpp_exporter_log_lost_bytes_total",
    "counter",
    SERVER,
    "Bytes lost: written just before a copytruncate or a restart and never read (where no close event "
    "is seen, what was written after the last look is estimated).",
)

EXPORTER_LOG_UNDERSTOOD = Family(
    "llamacpp_exporter_log_understood",
    "gauge",
    SERVER,
    "1 once a line that only llama-server writes was read; 0 when its first lines held none (not llama-server's "
    "log, or its format is not known) or it is binary data.",
)

EXPORTER_LOG_LONG_LINES = Family(
    "llamacpp_exporter_log_long_lines_total",
    "counter",
    SERVER,
    "Lines cut because they exceeded the maximum line length.",
)

EXPORTER_BUILD_INFO = Family(
    "llamacpp_exporter_build_info", "info", HOST, "Version of llamacpp-exporter.", labels=("version",)
)


# ---------------------------------- NVML (metrics/gpu.py; llamacpp_gpu_servers: metrics/servers.py)

GPU_MEMORY_TOTAL_BYTES = Family(
    "llamacpp_gpu_memory_total_bytes", "gauge", HOST, "Total GPU memory (NVML).", labels=("gpu", "uuid", "name")
)

GPU_MEMORY_USED_BYTES = Family(
    "llamacpp_gpu_memory_used_bytes", "gauge", HOST, "Used GPU memory (NVML).", labels=("gpu", "uuid", "name")
)

GPU_MEMORY_FREE_BYTES = Family(
    "llamacpp_gpu_memory_free_bytes", "gauge", HOST, "Free GPU memory (NVML).", labels=("gpu", "uuid", "name")
)

PROCESS_GPU_MEMORY_BYTES = Family(
    "llamacpp_process_gpu_memory_bytes",
    "gauge",
    SERVER,
    "GPU memory used by llama-server on this GPU (NVML process list, matched by pid).",
    labels=("gpu", "uuid"),
)

GPU_UTILIZATION_RATIO = Family(
    "llamacpp_gpu_utilization_ratio",
    "gauge",
    GPU,
    "Share of NVML's last sample period in which a kernel ran.",
    labels=("gpu", "uuid", "name"),
)

GPU_MEMORY_UTILIZATION_RATIO = Family(
    "llamacpp_gpu_memory_utilization_ratio",
    "gauge",
    GPU,
    "Share of NVML's last sample period in which device memory was read or written.",
    labels=("gpu", "uuid", "name"),
)

GPU_TEMPERATURE_CELSIUS = Family(
    "llamacpp_gpu_temperature_celsius", "gauge", GPU, "GPU core temperature (NVML).", labels=("gpu", "uuid", "name")
)

GPU_POWER_WATTS = Family(
    "llamacpp_gpu_power_watts", "gauge", GPU, "Power drawn by the board (NVML).", labels=("gpu", "uuid", "name")
)

GPU_POWER_LIMIT_WATTS = Family(
    "llamacpp_gpu_power_limit_watts", "gauge", GPU, "The power limit NVML enforces.", labels=("gpu", "uuid", "name")
)

GPU_SM_CLOCK_HERTZ = Family(
    "llamacpp_gpu_sm_clock_hertz",
    "gauge",
    GPU,
    "Streaming multiprocessor clock (NVML).",
    labels=("gpu", "uuid", "name"),
)

GPU_LAST_XID = Family(
    "llamacpp_gpu_last_xid",
    "gauge",
    GPU,
    "Code of the last Xid critical error NVML reported for this GPU.",
    labels=("gpu", "uuid", "name"),
)

GPU_THROTTLE_REASON = Family(
    "llamacpp_gpu_throttle_reason",
    "gauge",
    GPU,
    "Why the GPU's clocks are held down now (NVML's clock event reasons), 1 or 0.",
    labels=("gpu", "uuid", "name", "reason"),
    values={"reason": (*(r for _, r in THROTTLE_REASONS), "other")},
)

GPU_XID_ERRORS = Family(
    "llamacpp_gpu_xid_errors_total",
    "counter",
    GPU,
    "Xid critical errors NVML reported for this GPU since the exporter started.",
    labels=("gpu", "uuid", "name"),
)

GPU_SERVERS = Family(
    "llamacpp_gpu_servers",
    "gauge",
    HOST,
    "Followed servers (router children included) on the GPU's process list (NVML); above 1 they share its free "
    "memory (llamacpp_process_gpu_memory_bytes says how much each holds).",
    labels=("gpu", "uuid", "name"),
)


# ---------------------------------------------------- the process and the host (metrics/process.py)

PROCESS_FOUND_BY = Family(
    "llamacpp_process_found_by",
    "gauge",
    SERVER,
    "1 for how the llama-server process was found: pid, pid_file, log_file (it, or the wrapper that started it, "
    "names or writes the log), router (a router's child), unit (it runs in the journal unit's cgroup), or name (a "
    "guess: the only llama-server whose log cannot be told).",
    labels=("how",),
    values={"how": FOUND_BY},
)

PROCESS_RESIDENT_MEMORY_BYTES = Family(
    "llamacpp_process_resident_memory_bytes", "gauge", SERVER, "Resident memory (RSS) of the llama-server process."
)

PROCESS_START_TIME_SECONDS = Family(
    "llamacpp_process_start_time_seconds",
    "gauge",
    SERVER,
    "Start time of the llama-server process since the Unix epoch.",
)

HOST_MEMORY_AVAILABLE_BYTES = Family(
    "llamacpp_host_memory_available_bytes",
    "gauge",
    HOST,
    "MemAvailable of the host (/proc/meminfo; available physical memory on Windows and macOS): memory that can be "
    "used without swapping.",
)

HOST_MEMORY_TOTAL_BYTES = Family(
    "llamacpp_host_memory_total_bytes", "gauge", HOST, "Physical memory of the host (MemTotal)."
)


# ------------------------------------------- llama-server's HTTP endpoints (metrics/server_http.py)

UP = Family("llamacpp_up", "gauge", SERVER, "1 when llama-server answers /health with 200.")

SERVER_LOADING = Family(
    "llamacpp_server_loading", "gauge", SERVER, "1 while llama-server answers /health with 503 Loading model."
)

EXPORTER_HTTP_STATUS = Family(
    "llamacpp_exporter_http_status",
    "gauge",
    SERVER,
    "Last HTTP status of each llama-server endpoint (0 = no answer; 401 = API key missing or wrong, 501 = "
    "endpoint disabled).",
    labels=("endpoint",),
    values={"endpoint": tuple(dict.fromkeys((*ENDPOINTS, *ROUTER_ENDPOINTS)))},
)

EXPORTER_HTTP_VALUES_REJECTED = Family(
    "llamacpp_exporter_http_values_rejected_total",
    "counter",
    SERVER,
    "Reads of llama-server's /metrics whose value was absent or not a count it can have written (NaN, negative, "
    "fractional, text): the value is left out, the HTTP source stays up.",
    labels=("endpoint", "metric"),
    values={"endpoint": ("/metrics",)},
)


# --------------------------------------------------------- a router's children (metrics/servers.py)

ROUTER_CHILDREN = Family(
    "llamacpp_router_children",
    "gauge",
    ROUTER,
    "Router children (one per loaded model) running now, as the router's log says.",
)

ROUTER_CHILDREN_LIMIT = Family(
    "llamacpp_router_children_limit",
    "gauge",
    ROUTER,
    "Router children the exporter follows at most; a child past it is refused (not followed).",
)

ROUTER_CHILD_STARTS = Family(
    "llamacpp_router_child_starts_total", "counter", ROUTER, "Router children started (spawn lines)."
)

ROUTER_CHILD_EXITS = Family(
    "llamacpp_router_child_exits_total",
    "counter",
    ROUTER,
    "Router children that ended, by outcome: unloaded (after the router's stop line: an unload or an eviction), "
    "crashed (the child ended without being asked to).",
    labels=("outcome",),
    values={"outcome": EXIT_OUTCOMES},
)

ROUTER_CHILDREN_REFUSED = Family(
    "llamacpp_router_children_refused_total",
    "counter",
    ROUTER,
    "Router children not followed because the limit was reached (their lines are rejected as unfollowed).",
)
