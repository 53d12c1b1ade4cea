"""The first row, at a glance: what is wrong now (firing alerts, the pool's demand, usage and time to full,
the server's state, busy slots, aborts), then overcommit, VRAM, host RAM in caches and starts."""

from __future__ import annotations

from llamacpp_dashboard.layout import Layout
from llamacpp_dashboard.panels import (
    BLUE,
    GREEN,
    KV_SATURATED_RATIO,
    ORANGE,
    RED,
    SERVER_MAP,
    VRAM_HEADROOM_BYTES,
    Panel,
    alert_table,
    stat,
    thresholds,
    value_map,
)
from llamacpp_dashboard.query import OF_MODEL, q


def at_a_glance(lay: Layout) -> None:
    """The row "At a glance"."""
    lay.row("At a glance")
    lay.add(_firing_alerts(), 6, 5)
    lay.add(_demand(), 3, 5)
    lay.add(_full_in(), 3, 5)
    lay.add(_usage(), 3, 5)
    lay.add(_server_state(), 3, 5)
    lay.add(_slots_busy(), 3, 5)
    lay.add(_aborted(), 3, 5)
    lay.add(_sizing(), 5, 4)
    lay.add(_overcommit(), 5, 4)
    lay.add(_least_free_vram(), 5, 4)
    lay.add(_host_cache(), 5, 4)
    lay.add(_starts(), 4, 4)


def _firing_alerts() -> Panel:
    return alert_table(
        "Firing alerts",
        'ALERTS{alertstate="firing"}: the llamacpp-exporter alerts firing now (Prometheus\' own series), '
        "worst first: critical pages, warning is work for the day, info is context. Alerts about a host or "
        "a GPU (no instance label) are listed whatever instance is selected.",
        'ALERTS{job=~"$job", instance=~"$instance|", server=~"$server", model=~"$model", '
        'alertname=~"LlamaCpp.*", alertstate="firing"}',
    )


def _demand() -> Panel:
    return stat(
        "KV pool demand",
        'llamacpp_kv_pool_demand_ratio{horizon="prompt"}: what the requests in flight hold once their prompts '
        "are read, over the pool. Above 100% every request in flight will be aborted unless one ends first "
        "(LlamaCppKVPoolOverflowAhead pages); usage can still look low while it climbs.",
        q('llamacpp_kv_pool_demand_ratio{S, horizon="prompt"}', "{W}"),
        unit="percentunit",
        steps=thresholds((None, GREEN), (0.9, ORANGE), (1.0, RED)),
        decimals=0,
    )


def _full_in() -> Panel:
    return stat(
        "Pool full in",
        "llamacpp_kv_pool_full_eta_seconds: at the current prompt-processing and generation speeds, the "
        "time until the requests in flight fill the KV pool. 'not filling' while the pool is not filling "
        "or the requests in flight cannot fill it (llamacpp_kv_pool_used_tokens shows the server is known).",
        q("llamacpp_kv_pool_full_eta_seconds{S}\nor llamacpp_kv_pool_used_tokens{S} * 0 - 1", "{W}"),
        unit="s",
        steps=thresholds((None, RED), (60, ORANGE), (600, GREEN)),
        mappings=value_map(("-1", "not filling", GREEN)),
        decimals=0,
    )


def _usage() -> Panel:
    return stat(
        "KV pool usage",
        "llamacpp_kv_pool_usage_ratio: KV cells held by all slots / pool capacity. At 100% llama-server "
        "aborts every in-flight request; LlamaCppKVPoolSaturated pages above 90% for 30 s while requests run.",
        q("llamacpp_kv_pool_usage_ratio{S}", "{W}"),
        unit="percentunit",
        steps=thresholds((None, GREEN), (0.75, ORANGE), (KV_SATURATED_RATIO, RED)),
        decimals=1,
    )


def _server_state() -> Panel:
    return stat(
        "llama-server",
        "llamacpp_up (1 when llama-server answers /health with 200) and llamacpp_server_loading (1 while it "
        "loads a model: orange, not down); red 'exporter down' when Prometheus cannot scrape the exporter "
        "(up 0): then nothing is known about the server.",
        q(
            "llamacpp_up{S} + 2 * llamacpp_server_loading{S}\nor on (job, instance) (up{G} == 0) * 0 - 1",
            "{W}",
        ),
        unit="none",
        steps=thresholds((None, RED), (1, GREEN), (2, ORANGE)),
        mappings=SERVER_MAP,
        no_value="unknown",
    )


def _slots_busy() -> Panel:
    return stat(
        "Slots busy",
        "instance:llamacpp_slots_processing:sum (recording rule: the sum of llamacpp_slot_processing): how "
        "many requests run now.",
        q("instance:llamacpp_slots_processing:sum{S}", "{W}"),
        unit="short",
        steps=thresholds((None, GREEN)),
    )


def _aborted() -> Panel:
    return stat(
        "Aborted requests",
        "increase(llamacpp_requests_aborted_total[$__range]): requests llama-server answered with an error "
        "(send_error) in the time range; 'Context size has been exceeded' aborts every in-flight request.",
        q("sum by ({BY}) (increase(llamacpp_requests_aborted_total{S}[$__range]))", "{W}"),
        unit="short",
        steps=thresholds((None, GREEN), (1, RED)),
        decimals=0,
    )


def _overcommit() -> Panel:
    return stat(
        "Overcommit",
        "llamacpp_kv_pool_overcommit_ratio: slots x per-slot context / pool capacity. Above 1 the slots "
        "were promised more cells than the pool holds (-kvu; 4 on a default server): information, a risk "
        "once concurrent requests fill the pool (LlamaCppKVPoolOvercommitted).",
        q("llamacpp_kv_pool_overcommit_ratio{S}", "{W}"),
        unit="suffix:×",
        steps=thresholds((None, GREEN), (1.01, BLUE)),
        decimals=2,
    )


def _sizing() -> Panel:
    return stat(
        "Held together / pool (1d)" + OF_MODEL,
        "What LlamaCppKVPoolUndersized reads: instance:llamacpp_kv_pool_active_tokens:max_1d (the most the "
        "conversations in flight or coming back held together over the last day, at two samples in a row) over "
        "llamacpp_kv_pool_capacity_tokens. Past 90% it warns; below, it warns when this peak reaches the pool "
        "within 3 days at the day-over-day growth of the median of the busy samples "
        "(instance:llamacpp_kv_pool_full_in_days:1d); the request-size row has the details.",
        q("instance:llamacpp_kv_pool_active_tokens:max_1d{S} / llamacpp_kv_pool_capacity_tokens{S}", "{W}"),
        unit="percentunit",
        steps=thresholds((None, GREEN), (0.8, ORANGE), (0.9, RED)),
        decimals=0,
    )


def _least_free_vram() -> Panel:
    return stat(
        "Least free VRAM",
        "min of llamacpp_gpu_memory_free_bytes over the GPUs that llama-server uses (those that hold its "
        "memory, llamacpp_process_gpu_memory_bytes; every GPU where the exporter cannot tell); red below the "
        "512 MiB headroom of LlamaCppVRAMHeadroomLow.",
        q(
            "min by ({BY}) (llamacpp_gpu_memory_free_bytes{G} and on (instance, uuid) "
            "(llamacpp_process_gpu_memory_bytes{S} > 0) or (llamacpp_gpu_memory_free_bytes{G} unless on (instance) "
            "llamacpp_process_gpu_memory_bytes{S}))",
            "{W}",
        ),
        unit="bytes",
        steps=thresholds((None, RED), (VRAM_HEADROOM_BYTES, GREEN)),
    )


def _host_cache() -> Panel:
    return stat(
        "Host RAM in checkpoints + prompt cache",
        "instance:llamacpp_host_cache_bytes:sum (recording rule: llamacpp_checkpoint_bytes of all slots "
        "plus llamacpp_prompt_cache_bytes): host RAM llama-server holds beyond its model and KV cache.",
        q("instance:llamacpp_host_cache_bytes:sum{S}", "{W}"),
        unit="bytes",
        steps=thresholds((None, GREEN)),
    )


def _starts() -> Panel:
    return stat(
        "Server starts",
        "increase(llamacpp_server_starts_total[$__range]): llama-server starts seen in the log in the time "
        "range; several in a few minutes is a crash loop (LlamaCppServerRestarting).",
        q("sum by ({BY}) (increase(llamacpp_server_starts_total{S}[$__range]))", "{W}"),
        unit="short",
        steps=thresholds((None, GREEN), (1, ORANGE), (3, RED)),
        decimals=0,
    )
