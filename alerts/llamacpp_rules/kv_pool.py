"""The KV pool's alerts: the overflow ahead and now, the fill, the sizing, and the overflows that happened."""

from __future__ import annotations

from dataclasses import dataclass

from llamacpp_rules.builder import BUSY, HELD, SERVER, Alerts, Rule, Rules
from llamacpp_rules.clients import LARGEST_HOLDER
from llamacpp_rules.recording import choice, full_in_days, growth, peak
from llamacpp_rules.text import COUNT, THIS, figure, num


@dataclass(frozen=True)
class Settings:
    """The settings of these alerts: part of `Config` (`generate_rules.py --list`, `--set`)."""

    #: LlamaCppKVPoolOverflowAhead (warning, the guard's signal): the prompts in flight need more than this
    #: share of the pool, at two samples in a row.
    kv_overflow_ahead_ratio: float = 1.0
    kv_overflow_ahead_for: str = "0s"
    #: LlamaCppKVPoolOverflowPossible: at the limits their clients set (the `limits` horizon: known
    #: generation budgets; a request without one counts its prompt) the requests in flight need more than
    #: this share of the pool, while at least this many run.
    kv_overflow_possible_ratio: float = 1.0
    kv_overflow_possible_min_processing: int = 2
    kv_overflow_possible_for: str = "1m"
    #: LlamaCppKVPoolFillingUp: predict_linear over this window says the conversations in flight or coming back
    #: (llamacpp_kv_pool_active_ratio) fill the pool within N minutes.
    kv_fill_window: str = "10m"
    kv_fill_minutes: int = 15
    #: ... and they held at least this share of the pool through the whole window (a fill, not one new prompt).
    kv_fill_min_ratio: float = 0.5
    kv_fill_for: str = "2m"
    #: ... and it stays up this long after the trend flattens: a fill that pauses and resumes is one warning.
    kv_fill_keep_firing_for: str = "15m"
    #: LlamaCppKVPoolOvercommitted (info): overcommit above this while at least this many requests run and
    #: they hold more than overcommit_min_usage_ratio of the pool (idle slots' cells do not count: llama-server
    #: purges them when it needs room). A default server (-np auto, -kvu) is 4x overcommitted by design; only a
    #: pool that concurrent requests really fill makes it worth a look.
    overcommit_ratio: float = 1.0
    overcommit_min_processing: int = 2
    overcommit_min_usage_ratio: float = 0.5
    overcommit_for: str = "10m"
    #: LlamaCppKVPoolUndersized (warning): over this window, the conversations in flight or coming back held more
    #: than undersized_peak_ratio of the pool together (at two samples in a row), or that peak reaches the pool
    #: within undersized_forecast_days at the day-over-day growth of the median of the busy samples (today's
    #: window against the one before, once the one before's peak held at least undersized_trend_min_ratio of
    #: the pool; the peak itself is a coincidence of long conversations, too noisy to extrapolate); with at least
    #: undersized_min_requests requests in the window. No `for:`: its inputs already span two samples and a day.
    undersized_window: str = "1d"
    undersized_peak_ratio: float = 0.9
    undersized_forecast_days: int = 3
    undersized_trend_min_ratio: float = 0.5
    undersized_min_requests: int = 20
    #: LlamaCppKVPoolCapacityUnknown: slots known, pool size not, for this long.
    capacity_unknown_for: str = "10m"
    #: LlamaCppKVRetryCascade: a cascade that recovered (nothing aborted) within this window.
    event_window: str = "15m"
    #: LlamaCppContextExceeded: overflows within this window, once the page is over (the daytime follow-up).
    context_exceeded_window: str = "1d"


#: These alerts, in the rules file's order (`document.MODULES`).
ALERTS = Alerts()

DEMAND = "llamacpp_kv_pool_demand_ratio"


def forecast_text() -> str:
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


def choice_text(window: str) -> str:
    """The restart options that would have held the most the conversations held together over ``window``, each
    with its figure (read back from the recording rules; an option whose figure is not known is left out)."""
    pick, i = choice(window), 'printf "%.0f"'
    return (
        THIS
        + figure(
            peak(window), i, "", before=f" To hold the most held together in the last {window} (", after=" cells):"
        )
        + figure(pick["context"], i, "", before=" -c ")
        + figure(pick["extra_bytes"], "humanize1024", "", before=" (", after="B more KV memory)")
        + figure(pick["slots"], i, "", before="; or -np ", after=" (each as large as the largest request fits alone)")
        + figure(pick["per_slot"], i, "", before="; or --kv-unified-per-slot ")
        + figure(pick["per_slot_bytes"], "humanize1024", "", before=" (", after="B of KV memory in all)")
        + f"{{{{ with printf `{peak(window)}{{%s}}` $this | query }}}}. {{{{ end }}}}"
        + '{{ with printf `llamacpp_server_info{%s, type_k="f16"}` $this | query }}'
        "A q8_0 cache (-ctk/-ctv q8_0) halves the memory of each. {{ end }}"
    )


@ALERTS.add
def overflow_ahead(r: Rules) -> Rule:
    """LlamaCppKVPoolOverflowAhead (warning, the guard's signal): the prompts in flight do not fit the pool."""
    c = r.cfg
    prompt_demand, busy = r.m(DEMAND, 'horizon="prompt"'), BUSY
    return r.alert(
        "LlamaCppKVPoolOverflowAhead",
        f"{r.last_two(prompt_demand, '>', num(c.kv_overflow_ahead_ratio))}\nand ignoring (horizon) {busy} > 0",
        c.kv_overflow_ahead_for,
        "warning",
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
        + "This is seconds ahead: the guard (--guard.listen-address) acts on it by itself, holding back or "
        "stopping the request that would overflow the pool; a person cannot. If the overflow happens, "
        "LlamaCppKVPoolRequestsAborted pages. Without the guard: cancel the request that holds the most "
        "(dashboard: demand per slot; close that client's connection), then hold back new long prompts."
        + LARGEST_HOLDER,
    )


@ALERTS.add
def overflow_possible(r: Rules) -> Rule:
    """LlamaCppKVPoolOverflowPossible: the requests in flight outgrow the pool at their limits."""
    c = r.cfg
    limits_demand, busy = r.m(DEMAND, 'horizon="limits"'), BUSY
    return r.alert(
        "LlamaCppKVPoolOverflowPossible",
        f"{r.last_two(limits_demand, '>', num(c.kv_overflow_possible_ratio))}\n"
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


@ALERTS.add
def filling_up(r: Rules) -> Rule:
    """LlamaCppKVPoolFillingUp: the conversations in flight or coming back trend to the whole pool within minutes."""
    c, m, busy = r.cfg, r.m, BUSY
    active = m("llamacpp_kv_pool_active_ratio")
    # The conversations that will come back, not the pool's usage: idle slots of earlier conversations fill the
    # pool and are purged for room, and a new long prompt into a pool of them is a step, not a trend. Held
    # past kv_fill_min_ratio through the whole window: a fill, not one arrival.
    return r.alert(
        "LlamaCppKVPoolFillingUp",
        f"predict_linear({active}[{c.kv_fill_window}], {c.kv_fill_minutes} * 60) >= 1\n"
        f"and min_over_time({active}[{c.kv_fill_window}]) > {num(c.kv_fill_min_ratio)}\nand {busy} > 0",
        c.kv_fill_for,
        "warning",
        f"The conversations on llama-server<WHO> are predicted to fill its shared KV pool within {c.kv_fill_minutes} "
        "minutes.",
        f"At the trend of the last {c.kv_fill_window}, the conversations in flight or coming back on "
        f"{{{{ $labels.instance }}}}<WHO> would need {{{{ $value | humanizePercentage }}}} of the KV pool "
        f"{c.kv_fill_minutes} minutes from now: it fills up before that, and then every in-flight request is "
        "aborted. Check which slots grow (dashboard: tokens per slot), cap long generations (n_predict) or move "
        "clients away; plan --kv-unified-per-slot or -ctk/-ctv q8_0.",
        keep_firing_for=c.kv_fill_keep_firing_for,
    )


@ALERTS.add
def overcommitted(r: Rules) -> Rule:
    """LlamaCppKVPoolOvercommitted (info): the slots are promised more than the pool, and fill it."""
    c, m, busy = r.cfg, r.m, BUSY
    capacity = m("llamacpp_kv_pool_capacity_tokens")
    return r.alert(
        "LlamaCppKVPoolOvercommitted",
        f"{m('llamacpp_kv_pool_overcommit_ratio')} > {num(c.overcommit_ratio)}\n"
        f"and {HELD} / {capacity} > {num(c.overcommit_min_usage_ratio)}\n"
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


@ALERTS.add
def undersized(r: Rules) -> Rule:
    """LlamaCppKVPoolUndersized: what the conversations held together came near the pool, or grows day over day
    towards it."""
    c, m = r.cfg, r.m
    window = c.undersized_window
    capacity = m("llamacpp_kv_pool_capacity_tokens")
    i = 'printf "%.0f"'
    return r.alert(
        "LlamaCppKVPoolUndersized",
        "\n".join(
            [
                "(",
                f"  {peak(window)} > {num(c.undersized_peak_ratio)} * {capacity}",
                f"  or {full_in_days(window)} <= {c.undersized_forecast_days}",
                ")",
                f"and increase({m('llamacpp_request_tokens_count')}[{window}]) >= {c.undersized_min_requests}",
            ]
        ),
        "0s",
        "warning",
        "llama-server's KV pool<WHO> is too small, or will be within days, for the conversations it serves "
        "together: when they outgrow it, every request in flight is aborted.",
        THIS
        + "Over the last "
        + window
        + ", the conversations in flight or coming back on {{ $labels.instance }}<WHO> held up to "
        + figure(peak(window), i, "?")
        + " KV cells together (at two samples in a row), and the pool has "
        + figure("llamacpp_kv_pool_capacity_tokens", i, "?")
        + ". "
        + figure(
            growth(window),
            "humanizePercentage",
            "",
            before="What they held together at a typical busy moment (the median of the busy samples) grew by ",
            after=" since the day before: ",
        )
        + figure(
            full_in_days(window),
            'printf "%.1f"',
            "",
            before="at that growth the peak reaches the pool in ",
            after=" days",
        )
        + figure(
            f"time() + 86400 * {full_in_days(window)}",
            "humanizeTimestamp",
            "",
            before=" (around ",
            after="). ",
        )
        + "When long conversations run together past the pool, llama-server aborts every request in flight. "
        "In the daytime, resize it:"
        + choice_text(window)
        + "Or run the guard in front of it. The sizing tile of the dashboard shows this peak over the pool.",
    )


@ALERTS.add
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


def _pages_firing() -> str:
    return (
        f"on ({SERVER}) "
        'ALERTS{alertname=~"LlamaCppKVPoolRequestsAborted|LlamaCppKVPoolSaturated", alertstate="firing"}'
    )


@ALERTS.add
def context_exceeded(r: Rules) -> Rule:
    """LlamaCppContextExceeded: the pool overflowed within the day; the page for it is over (the follow-up)."""
    c, m = r.cfg, r.m
    return r.alert(
        "LlamaCppContextExceeded",
        f"increase({m('llamacpp_context_exceeded_total')}[{c.context_exceeded_window}]) > 0\nunless {_pages_firing()}",
        "0m",
        "warning",
        "llama-server<WHO> ran out of KV cells and aborted every in-flight request; the sizing needs a fix.",
        "{{ $labels.instance }}<WHO> logged 'Context size has been exceeded' in the last "
        f"{c.context_exceeded_window} (count: {COUNT}): the shared KV pool was full, and every request in flight "
        "at that moment was answered with HTTP 500, small ones included. The page for it "
        "(LlamaCppKVPoolRequestsAborted or Saturated) is over; this stays until a day without one. Confirm "
        "with grep 'Context size has been exceeded' in the server log; in the daytime, fix the sizing: "
        "--kv-unified-per-slot, -ctk/-ctv q8_0, fewer slots or no -kvu, a smaller -c." + LARGEST_HOLDER,
    )


@ALERTS.add
def retry_cascade(r: Rules) -> Rule:
    """LlamaCppKVRetryCascade: llama-server found its pool full, retried with smaller batches and recovered."""
    c, m = r.cfg, r.m
    recovered = m("llamacpp_kv_cascades_total", 'outcome="recovered"')
    return r.alert(
        "LlamaCppKVRetryCascade",
        f"sum without (outcome) (increase({recovered}[{c.event_window}])) > 0\nunless {_pages_firing()}",
        "0m",
        "warning",
        "llama-server<WHO> found its KV pool full and retried with smaller batches (nothing aborted yet).",
        f"{{{{ $labels.instance }}}}<WHO> ran KV retry cascades that recovered in the last {c.event_window} "
        f"(count: {COUNT}; 'failed to find free space in the KV cache, retrying with smaller batch "
        "size'). The pool was full and nothing was lost this time; a cascade that ends in 'Context size has "
        "been exceeded' aborts every request (then LlamaCppKVPoolRequestsAborted pages). Look at the slots' "
        "tokens on the dashboard and plan the pool: --kv-unified-per-slot, -ctk/-ctv q8_0, fewer slots.",
    )
