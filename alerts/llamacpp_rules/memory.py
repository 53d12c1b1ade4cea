"""The memory alerts: a GPU's free VRAM and the host's available RAM, one alert per GPU or host."""

from __future__ import annotations

from dataclasses import dataclass

from llamacpp_rules.builder import Alerts, Rule, Rules, host
from llamacpp_rules.text import num


@dataclass(frozen=True)
class Settings:
    """The settings of these alerts: part of `Config` (`generate_rules.py --list`, `--set`)."""

    #: LlamaCppVRAMHeadroomLow: free memory of a GPU that llama-server uses below this many bytes (512 MiB).
    vram_free_bytes: int = 512 * 1024 * 1024
    vram_for: str = "5m"
    #: LlamaCppHostMemoryLow: MemAvailable below this fraction of MemTotal.
    host_available_ratio: float = 0.1
    host_for: str = "5m"


#: These alerts, in the rules file's order (`document.MODULES`).
ALERTS = Alerts()


@ALERTS.add
def vram_headroom_low(r: Rules) -> Rule:
    """LlamaCppVRAMHeadroomLow: a GPU that llama-server uses has almost no free memory."""
    c, m = r.cfg, r.m
    # One alert per GPU (its uuid) and host, however many exporters on the host see it. `host` is the
    # target's `node` label where service discovery sets one (deploy/kubernetes/podmonitor.yaml), else
    # its instance without the port (exporters on one host differ in the port only).
    free = m("llamacpp_gpu_memory_free_bytes")
    proc_gpu = m("llamacpp_process_gpu_memory_bytes")
    return r.alert(
        "LlamaCppVRAMHeadroomLow",
        "\n".join(
            [
                "min by (job, host, uuid, name) (",
                *host(
                    [
                        # The GPUs that hold llama-server's memory; every GPU where the exporter
                        # cannot tell (llama-server in another pid namespace: no process series).
                        f"{free}",
                        f"and on (instance, uuid) ({proc_gpu} > 0)",
                        f"or ({free} unless on (instance) {proc_gpu})",
                    ]
                ),
                f") < {num(c.vram_free_bytes)}",
            ]
        ),
        c.vram_for,
        "warning",
        "A GPU that llama-server uses has almost no free memory.",
        "GPU {{ $labels.uuid }} ({{ $labels.name }}) on {{ $labels.host }} has only "
        "{{ $value | humanize1024 }}B free; the next compute-buffer allocation (a long prompt, a bigger "
        "batch) can fail and abort requests or crash the server. Free VRAM: a smaller -c, -ctk/-ctv q8_0, "
        "fewer slots, fewer layers on the GPU (-ngl), or a smaller batch (-b/-ub); or move another "
        "process off this GPU (dashboard: GPU memory by server).",
    )


@ALERTS.add
def host_memory_low(r: Rules) -> Rule:
    """LlamaCppHostMemoryLow: the host's available RAM is low."""
    c, m = r.cfg, r.m
    return r.alert(
        "LlamaCppHostMemoryLow",
        "\n".join(
            [
                "min by (job, host) (",
                *host(
                    [
                        f"{m('llamacpp_host_memory_available_bytes')}",
                        f"/ {m('llamacpp_host_memory_total_bytes')}",
                    ]
                ),
                f") < {num(c.host_available_ratio)}",
            ]
        ),
        c.host_for,
        "warning",
        "The host that runs llama-server is running out of memory.",
        "Only {{ $value | humanizePercentage }} of host RAM is available on {{ $labels.host }}. "
        "llama-server keeps context checkpoints and its prompt cache in host RAM (hundreds of MiB each; "
        "see llamacpp_checkpoint_bytes and llamacpp_prompt_cache_bytes); the OOM killer is next. Limit "
        "them: --ctx-checkpoints N (fewer per slot), --cache-ram MiB (0 disables the prompt cache).",
    )
