"""The memory row: VRAM per GPU and per server, host RAM in checkpoints and the prompt cache, KV cache size."""

from __future__ import annotations

from llamacpp_dashboard.layout import Layout
from llamacpp_dashboard.panels import (
    GREEN,
    RED,
    VRAM_HEADROOM_BYTES,
    Panel,
    bargauge,
    per_instance,
    thresholds,
    timeseries,
)
from llamacpp_dashboard.query import q


def memory(lay: Layout) -> None:
    """The row "Memory"."""
    lay.row("Memory")
    lay.add(_free_vram(), 8, 8)
    lay.add(_gpu_memory_by_server(), 8, 8)
    lay.add(_gpu_memory_vs_card(), 8, 8)
    lay.add(_host_ram(), 8, 8)
    lay.add(_checkpoints(), 8, 8)
    lay.add(_kv_cache_memory(), 8, 8)


def _free_vram() -> Panel:
    return timeseries(
        "Free VRAM per GPU",
        "llamacpp_gpu_memory_free_bytes per GPU (NVML) with the 512 MiB headroom line of "
        "LlamaCppVRAMHeadroomLow: below it the next compute-buffer allocation can fail.",
        [q("llamacpp_gpu_memory_free_bytes{G}", "{{instance}} GPU {{gpu}} {{name}}")],
        unit="bytes",
        threshold_steps=thresholds((None, RED), (VRAM_HEADROOM_BYTES, "transparent")),
        threshold_style="line+area",
    )


def _gpu_memory_by_server() -> Panel:
    return bargauge(
        "GPU memory by server",
        "Per GPU: each llama-server's own VRAM (llamacpp_process_gpu_memory_bytes, by server and model: a "
        "router's children are one bar each) next to the GPU's free memory (llamacpp_gpu_memory_free_bytes, "
        "red below the 512 MiB headroom of LlamaCppVRAMHeadroomLow). Servers listed under one GPU share it: "
        "a new model or a longer context on one of them takes the others' headroom.",
        [
            q(
                "label_replace(sum by (instance, gpu, server, model) (llamacpp_process_gpu_memory_bytes{S}),"
                ' "what", "llama-server", "", "")\n'
                "or label_replace(sum by (instance, gpu) (llamacpp_gpu_memory_free_bytes{G}),"
                ' "what", "free", "", "")',
                "{{instance}} GPU {{gpu}} {{what}} {{server}} {{model}}",
            )
        ],
        unit="bytes",
        overrides=[
            {
                "matcher": {"id": "byRegexp", "options": ".* free\\s*$"},
                "properties": [
                    {"id": "color", "value": {"mode": "thresholds"}},
                    {"id": "thresholds", "value": thresholds((None, RED), (VRAM_HEADROOM_BYTES, GREEN))},
                ],
            }
        ],
    )


def _gpu_memory_vs_card() -> Panel:
    return timeseries(
        "GPU memory: llama-server vs card",
        "llamacpp_process_gpu_memory_bytes (llama-server's own VRAM), llamacpp_gpu_memory_used_bytes and "
        "llamacpp_gpu_memory_total_bytes per GPU (NVML).",
        [
            q("llamacpp_process_gpu_memory_bytes{S}", "{W} GPU {{gpu}} llama-server", "A"),
            q("llamacpp_gpu_memory_used_bytes{G}", "{{instance}} GPU {{gpu}} used", "B"),
            q("llamacpp_gpu_memory_total_bytes{G}", "{{instance}} GPU {{gpu}} total", "C"),
        ],
        unit="bytes",
    )


def _host_ram() -> Panel:
    return per_instance(
        timeseries(
            "Host RAM: checkpoints + prompt cache vs available",
            "Stacked: llamacpp_checkpoint_bytes (all slots' context checkpoints) and llamacpp_prompt_cache_bytes "
            "(host-RAM prompt cache), against llamacpp_prompt_cache_limit_bytes (--cache-ram), "
            "llamacpp_host_memory_available_bytes (MemAvailable) and llamacpp_process_resident_memory_bytes "
            "(llama-server RSS).",
            [
                q("sum by ({BY}) (llamacpp_checkpoint_bytes{S})", "{W} checkpoints", "A"),
                q("llamacpp_prompt_cache_bytes{S}", "{W} prompt cache", "B"),
                q("llamacpp_prompt_cache_limit_bytes{S}", "{W} prompt cache limit", "C"),
                q("llamacpp_host_memory_available_bytes{G}", "{{instance}} available", "D"),
                q("llamacpp_process_resident_memory_bytes{S}", "{W} llama-server RSS", "E"),
            ],
            unit="bytes",
            stack=True,
            overrides=[
                {
                    "matcher": {"id": "byFrameRefID", "options": ref},
                    "properties": [
                        {"id": "custom.stacking", "value": {"group": ref, "mode": "none"}},
                        {"id": "custom.fillOpacity", "value": 0},
                        {"id": "custom.lineWidth", "value": 2},
                    ],
                }
                for ref in ("C", "D", "E")
            ],
        )
    )


def _checkpoints() -> Panel:
    return timeseries(
        "Context checkpoints",
        "llamacpp_checkpoints per slot (live context checkpoints, SWA/hybrid models) and the rate of "
        "llamacpp_checkpoint_events_total by event (created, restored, invalidated, evicted).",
        [
            q("llamacpp_checkpoints{S}", "{W} slot {{slot}}", "A"),
            q(
                "sum by ({BY}, event) (increase(llamacpp_checkpoint_events_total{S}[$__rate_interval]))",
                "{W} {{event}}",
                "B",
            ),
        ],
        unit="short",
    )


def _kv_cache_memory() -> Panel:
    return per_instance(
        timeseries(
            "KV cache memory",
            "llamacpp_kv_cache_bytes by kind (k, v): KV cache memory from llama-server's size line.",
            [q("llamacpp_kv_cache_bytes{S}", "{W} {{kind}}")],
            unit="bytes",
            stack=True,
        )
    )
