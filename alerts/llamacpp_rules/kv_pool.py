"""The KV pool's alerts: the overflow ahead and now, the fill, the sizing, and the overflows that happened."""

from __future__ import annotations

from llamacpp_rules.builder import BUSY, Rule, Rules
from llamacpp_rules.clients import LARGEST_HOLDER
from llamacpp_rules.text import COUNT, THIS, figure, num

DEMAND = "llamacpp_kv_pool_demand_ratio"


def _forecast() -> str:
    """What the forecast says of the alert's server: demand now and at the clients' limits, time to full."""
    pct, never = "humanizePercentage", "unknown"
    return (
        THIS + "Forecast: the prompts in flight need "
        + figure(DEMAND, pct, never, 'horizon="prompt"')
        + " of the pool, at the limits their clients set "
        + figure(DEMAND, pct, never, 'horizon="limits"')
        + " ("
        + figure("llamacpp_kv_pool_demand_unknown_budget_slots", 'printf "%.0f"', "?")
        + " without a limit); "
        + figure(
            "llamacpp_kv_pool_full_eta_seconds", "humanizeDuration", "not filling now.",
            before="full in ", after=" at the current speed.",
        )
    )  # fmt: skip


def overflow_ahead(r: Rules) -> Rule:
    """LlamaCppKVPoolOverflowAhead (critical): the prompts in flight do not fit the pool."""
    c = r.cfg
    prompt_demand, busy = r.m(DEMAND, 'horizon="prompt"'), BUSY
    return r.alert(
        "LlamaCppKVPoolOverflowAhead",
        f"{prompt_demand} > {num(c.kv_overflow_ahead_ratio)}\nand ignoring (horizon) {busy} > 0",
        c.kv_overflow_ahead_for,
        "critical",
        "The prompts in flight on llama-server<WHO> do not fit its KV pool: every request will be aborted.",
        "Once the prompts now being processed on {{ $labels.instance }}<WHO> are read, they need {{ $value | "
        "humanizePercentage }} of the shared KV pool. When it is full llama-server aborts EVERY in-flight "
        "request ('Context size has been exceeded', HTTP 500), small ones included, unless a request ends "
        "first. "
        + THIS
        + figure(
            "llamacpp_kv_pool_full_eta_seconds",
            "humanizeDuration",
            "",
            before="At the current speed it is full in ",
            after=". ",
        )
        + "Act in the time left: cancel the request that holds the most "
        "(dashboard: demand per slot; close that client's connection), then hold back new long prompts."
        + LARGEST_HOLDER,
    )


def saturated(r: Rules) -> Rule:
    """LlamaCppKVPoolSaturated (critical): the pool is almost full while requests run."""
    c, m, busy = r.cfg, r.m, BUSY
    usage, prompt_demand = m("llamacpp_kv_pool_usage_ratio"), m(DEMAND, 'horizon="prompt"')
    return r.alert(
        "LlamaCppKVPoolSaturated",
        f"{usage} > {num(c.kv_saturated_ratio)}\n"
        f"and ignoring (horizon) {prompt_demand} > {num(c.kv_saturated_ratio)}\nand {busy} > 0",
        c.kv_saturated_for,
        "critical",
        f"llama-server's shared KV pool<WHO> has been almost full for {c.kv_saturated_for} while requests run.",
        "The KV pool of {{ $labels.instance }}<WHO> is {{ $value | humanizePercentage }} full and the requests "
        "in flight hold that much. When it is full, llama-server halves its batch down to 1 and then "
        "aborts EVERY in-flight request with 'Context size has been exceeded' (HTTP 500). "
        + _forecast()
        + " Act now: cancel the request that holds the most (dashboard: demand per slot), stop sending new "
        "long requests to this instance or drain it. In the daytime, size the pool so every slot's "
        "promise can be kept: --kv-unified-per-slot, -ctk/-ctv q8_0, fewer slots (-np) or no -kvu, a "
        "smaller -c." + LARGEST_HOLDER,
    )


def overflow_possible(r: Rules) -> Rule:
    """LlamaCppKVPoolOverflowPossible: the requests in flight outgrow the pool at their limits."""
    c = r.cfg
    limits_demand, busy = r.m(DEMAND, 'horizon="limits"'), BUSY
    return r.alert(
        "LlamaCppKVPoolOverflowPossible",
        f"{limits_demand} > {num(c.kv_overflow_possible_ratio)}\n"
        f"and ignoring (horizon) {busy} >= {c.kv_overflow_possible_min_processing}",
        c.kv_overflow_possible_for,
        "warning",
        "The requests in flight on llama-server<WHO> may together outgrow its KV pool at their limits.",
        "If the requests running on {{ $labels.instance }}<WHO> generate up to the limits their clients set "
        "(max_tokens / n_predict, from /slots: --server-url gives them; a request without a limit counts "
        "its prompt, see llamacpp_kv_pool_demand_unknown_budget_slots), they need {{ $value | "
        "humanizePercentage }} of the shared KV pool, and an overflow aborts all of them. Cap "
        "generations (max_tokens / n_predict), keep long requests apart, or size the pool: "
        "--kv-unified-per-slot, -ctk/-ctv q8_0, fewer slots.",
    )


def filling_up(r: Rules) -> Rule:
    """LlamaCppKVPoolFillingUp: the usage trend reaches the whole pool within minutes."""
    c, m, busy = r.cfg, r.m, BUSY
    return r.alert(
        "LlamaCppKVPoolFillingUp",
        f"predict_linear({m('llamacpp_kv_pool_usage_ratio')}[{c.kv_fill_window}], {c.kv_fill_minutes} * 60)"
        f" >= 1\nand {m('llamacpp_kv_pool_usage_ratio')} > {num(c.kv_fill_min_ratio)}\nand {busy} > 0",
        c.kv_fill_for,
        "warning",
        f"llama-server's shared KV pool<WHO> is predicted to be full within {c.kv_fill_minutes} minutes.",
        f"At the trend of the last {c.kv_fill_window}, the KV pool of {{{{ $labels.instance }}}}<WHO> would "
        f"need {{{{ $value | humanizePercentage }}}} of its cells {c.kv_fill_minutes} minutes from now: it "
        "fills up before that, and then every in-flight request is aborted. Check which slots grow "
        "(dashboard: tokens per slot), cap long generations (n_predict) or move clients away; plan "
        "--kv-unified-per-slot or -ctk/-ctv q8_0.",
    )


def overcommitted(r: Rules) -> Rule:
    """LlamaCppKVPoolOvercommitted (info): the slots are promised more than the pool, and fill it."""
    c, m, busy = r.cfg, r.m, BUSY
    usage = m("llamacpp_kv_pool_usage_ratio")
    return r.alert(
        "LlamaCppKVPoolOvercommitted",
        f"{m('llamacpp_kv_pool_overcommit_ratio')} > {num(c.overcommit_ratio)}\n"
        f"and {usage} > {num(c.overcommit_min_usage_ratio)}\n"
        f"and {busy} >= {c.overcommit_min_processing}",
        c.overcommit_for,
        "info",
        "llama-server's slots<WHO> are promised more KV cells than the pool holds, and concurrent requests fill it.",
        "{{ $labels.instance }}<WHO> promises its slots {{ $value | humanize }}x the KV pool (-kvu: every slot "
        f"may use the whole -c window), and concurrent requests have held more than "
        f"{num(c.overcommit_min_usage_ratio * 100)}% of it for {c.overcommit_for}: a few long ones can fill "
        "the pool and abort all others. Nothing to do tonight; when sizing, either keep every promise "
        "(--kv-unified-per-slot N, or no -kvu with -c = slots x per-slot context), make the pool bigger "
        "for the same memory (-ctk/-ctv q8_0), or run fewer slots (-np).",
    )


def undersized(r: Rules) -> Rule:
    """LlamaCppKVPoolUndersized: a day's p99 request times its p99 concurrency outgrows the pool."""
    c, m = r.cfg, r.m
    window = c.undersized_window
    needed = f"instance:llamacpp_kv_pool_needed_tokens:p99_{window}"
    return r.alert(
        "LlamaCppKVPoolUndersized",
        f"{needed}\n> {m('llamacpp_kv_pool_capacity_tokens')}\n"
        f"and increase({m('llamacpp_request_tokens_count')}[{window}]) >= {c.undersized_min_requests}",
        c.undersized_for,
        "warning",
        "llama-server's KV pool<WHO> is too small for the requests it serves: a day of long requests "
        "at once will abort every request in flight.",
        THIS
        + "Over the last "
        + window
        + ", the p99 request on {{ $labels.instance }}<WHO> held "
        + figure(f"instance:llamacpp_request_tokens:p99_{window}", 'printf "%.0f"', "?")
        + " tokens and p99 "
        + figure(f"instance:llamacpp_request_concurrency:p99_{window}", 'printf "%.1f"', "?")
        + ' requests ran at once: together they need about {{ $value | printf "%.0f" }} KV cells, and the '
        "pool has "
        + figure("llamacpp_kv_pool_capacity_tokens", 'printf "%.0f"', "?")
        + ". Nothing has to overflow yet; the first time that many long requests run together, "
        "llama-server aborts every request in flight. In the daytime: give each slot its own window "
        "(--kv-unified-per-slot N: one request can no longer abort the others), run fewer slots (-np), "
        "or afford a larger pool (-ctk/-ctv q8_0 halves the cache, then a larger -c).",
    )


def capacity_unknown(r: Rules) -> Rule:
    """LlamaCppKVPoolCapacityUnknown: slots known, the pool size not."""
    c, m = r.cfg, r.m
    return r.alert(
        "LlamaCppKVPoolCapacityUnknown",
        f"{m('llamacpp_slots')}\nunless {m('llamacpp_kv_pool_capacity_tokens')}",
        c.capacity_unknown_for,
        "warning",
        "llamacpp-exporter does not know the size of llama-server's KV pool<WHO>: the KV alerts are blind.",
        "llamacpp-exporter at {{ $labels.instance }}<WHO> sees llama-server's {{ $value }} slots but not "
        "how many cells its KV pool has, so the usage, demand and overcommit ratios are not exported and "
        "LlamaCppKVPoolOverflowAhead, Saturated, OverflowPossible and FillingUp cannot fire. The log lines "
        "that state it were not read (hidden at the default verbosity on recent builds, or written "
        "before the exporter started) and llama-server's command line was not readable. Give it one: "
        "--pid (or --proc-root in a container) so it reads the command line, --kv-pool-capacity TOKENS, "
        "or start llama-server with -lv 4.",
    )


def context_exceeded(r: Rules) -> Rule:
    """LlamaCppContextExceeded: llama-server aborted every request in flight."""
    c, m = r.cfg, r.m
    return r.alert(
        "LlamaCppContextExceeded",
        f"increase({m('llamacpp_context_exceeded_total')}[{c.event_window}]) > 0",
        "0m",
        "warning",
        "llama-server<WHO> ran out of KV cells and aborted every in-flight request.",
        "{{ $labels.instance }}<WHO> logged 'Context size has been exceeded' in the last "
        f"{c.event_window} (count: {COUNT}): the shared KV pool was full, and every request in flight at that "
        "moment was answered with HTTP 500, small ones included. It is over; while it keeps happening "
        "the KV pages (OverflowAhead, Saturated) fire. Confirm with grep 'Context size has been exceeded' "
        "in the server log; in the daytime, fix the sizing: --kv-unified-per-slot, -ctk/-ctv q8_0, fewer "
        "slots or no -kvu, a smaller -c." + LARGEST_HOLDER,
    )


def retry_cascade(r: Rules) -> Rule:
    """LlamaCppKVRetryCascade: llama-server found its pool full and retried with smaller batches."""
    c, m = r.cfg, r.m
    return r.alert(
        "LlamaCppKVRetryCascade",
        f"sum without (outcome) (increase({m('llamacpp_kv_cascades_total')}[{c.event_window}])) > 0",
        "0m",
        "warning",
        "llama-server<WHO> found its KV pool full and retried with smaller batches.",
        f"{{{{ $labels.instance }}}}<WHO> ran KV retry cascades in the last {c.event_window} (count: {COUNT}; "
        "'failed to find free space in the KV cache, retrying with smaller batch "
        "size'). The pool was full; a cascade that ends in 'Context size has been exceeded' aborts every "
        "request. Look at the slots' tokens on the dashboard and plan the pool: --kv-unified-per-slot, "
        "-ctk/-ctv q8_0, fewer slots.",
    )
