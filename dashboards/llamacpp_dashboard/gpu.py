"""The GPU row: load, temperature, power, clocks and why they are held down, Xid errors (NVML, per GPU)."""

from __future__ import annotations

from llamacpp_dashboard.layout import Layout
from llamacpp_dashboard.panels import Panel, timeseries
from llamacpp_dashboard.query import q


def gpu(lay: Layout) -> None:
    """The row "GPU"."""
    lay.row("GPU")
    lay.add(_utilization(), 8, 8)
    lay.add(_temperature(), 8, 8)
    lay.add(_power(), 8, 8)
    lay.add(_sm_clock(), 8, 8)
    lay.add(_throttle(), 8, 8)
    lay.add(_xid(), 8, 8)


def _utilization() -> Panel:
    return timeseries(
        "GPU and memory-controller load",
        "llamacpp_gpu_utilization_ratio (share of NVML's last sample period in which a kernel ran) and "
        "llamacpp_gpu_memory_utilization_ratio (device memory read or written), per GPU. Token generation is "
        "bound by memory: a busy memory controller with a low kernel share is normal while generating.",
        [
            q("llamacpp_gpu_utilization_ratio{G}", "{{instance}} GPU {{gpu}} kernels", "A"),
            q("llamacpp_gpu_memory_utilization_ratio{G}", "{{instance}} GPU {{gpu}} memory", "B"),
        ],
        unit="percentunit",
        max_=1,
    )


def _temperature() -> Panel:
    return timeseries(
        "GPU temperature",
        "llamacpp_gpu_temperature_celsius per GPU (NVML, the core sensor).",
        [q("llamacpp_gpu_temperature_celsius{G}", "{{instance}} GPU {{gpu}} {{name}}")],
        unit="celsius",
        min_=None,
    )


def _power() -> Panel:
    return timeseries(
        "GPU power draw vs limit",
        "llamacpp_gpu_power_watts (board power) against llamacpp_gpu_power_limit_watts (the limit NVML "
        "enforces): a draw at the limit holds the clocks down (sw_power_cap in the throttle panel).",
        [
            q("llamacpp_gpu_power_watts{G}", "{{instance}} GPU {{gpu}} draw", "A"),
            q("llamacpp_gpu_power_limit_watts{G}", "{{instance}} GPU {{gpu}} limit", "B"),
        ],
        unit="watt",
    )


def _sm_clock() -> Panel:
    return timeseries(
        "SM clock",
        "llamacpp_gpu_sm_clock_hertz per GPU (NVML): it falls when the GPU is throttled.",
        [q("llamacpp_gpu_sm_clock_hertz{G}", "{{instance}} GPU {{gpu}} {{name}}")],
        unit="hertz",
    )


def _throttle() -> Panel:
    return timeseries(
        "Why the clocks are held down",
        "llamacpp_gpu_throttle_reason == 1 per GPU and reason (NVML's clock event reasons): gpu_idle is "
        "harmless; sw_power_cap, hw_slowdown, sw/hw_thermal_slowdown and hw_power_brake_slowdown while "
        "llama-server generates mean slower tokens.",
        [
            q(
                'llamacpp_gpu_throttle_reason{G, reason!="gpu_idle"} == 1',
                "{{instance}} GPU {{gpu}} {{reason}}",
            )
        ],
        unit="bool",
        max_=1,
        bars=True,
    )


def _xid() -> Panel:
    return timeseries(
        "Xid errors",
        "increase(llamacpp_gpu_xid_errors_total) over each interval, per GPU: Xid critical errors from NVML's "
        "event API (llamacpp_gpu_last_xid gives the last one's code: 79 a GPU fallen off the bus, 48 a "
        "double-bit ECC error, 13 and 31 mostly the application's fault).",
        [q("increase(llamacpp_gpu_xid_errors_total{G}[$__rate_interval])", "{{instance}} GPU {{gpu}} {{name}}")],
        unit="short",
        bars=True,
    )
