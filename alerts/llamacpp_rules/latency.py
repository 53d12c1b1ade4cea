"""The request-latency alert: slow first tokens that full prompt re-processing explains."""

from __future__ import annotations

from dataclasses import dataclass

from llamacpp_rules.builder import Alerts, Rule, Rules
from llamacpp_rules.text import num


@dataclass(frozen=True)
class Settings:
    """The settings of these alerts: part of `Config` (`generate_rules.py --list`, `--set`)."""

    #: LlamaCppSlowFirstTokenReprocessing: the p95 time to first token over the window above this many seconds
    #: (a bucket bound of llamacpp_time_to_first_token_seconds: 5, 10, 30, 60 …), while prompts re-processed
    #: whole (cache="full_reprocess") took more than this share of all the time spent on first tokens.
    slow_first_token_seconds: float = 10.0
    slow_first_token_reprocess_share: float = 0.5
    slow_first_token_window: str = "30m"
    slow_first_token_for: str = "15m"


#: These alerts, in the rules file's order (`document.MODULES`).
ALERTS = Alerts()

TTFT = "llamacpp_time_to_first_token_seconds"


@ALERTS.add
def slow_first_token_reprocessing(r: Rules) -> Rule:
    """LlamaCppSlowFirstTokenReprocessing: the p95 time to first token is high, and most of it is prompts
    evaluated whole again (a context checkpoint or the prompt cache missed)."""
    c, m = r.cfg, r.m
    w = c.slow_first_token_window
    # Per server, whatever other labels its target has: the cache outcomes summed away, nothing else.
    p95 = f"histogram_quantile(0.95, sum without (cache) (rate({m(TTFT + '_bucket')}[{w}])))"
    reprocessed = (
        f"sum without (cache) (rate({m(TTFT + '_sum', 'cache=' + chr(34) + 'full_reprocess' + chr(34))}[{w}]))"
    )
    everything = f"sum without (cache) (rate({m(TTFT + '_sum')}[{w}]))"
    return r.alert(
        "LlamaCppSlowFirstTokenReprocessing",
        f"{p95} > {num(c.slow_first_token_seconds)}\nand\n"
        f"{reprocessed}\n/ {everything} > {num(c.slow_first_token_reprocess_share)}",
        c.slow_first_token_for,
        "warning",
        "Slow first tokens on llama-server<WHO>, mostly from prompts re-processed whole.",
        "The p95 time to first token on {{ $labels.instance }}<WHO> over the last "
        f"{w} is {{{{ $value | humanizeDuration }}}} (above {num(c.slow_first_token_seconds)} s), and "
        f'prompts evaluated whole again (cache="full_reprocess": no usable context checkpoint or cached '
        f"prompt) took more than {c.slow_first_token_reprocess_share:.0%} of the time spent on first tokens. "
        "Conversations come back to a slot whose cache cannot be reused: a sliding-window or hybrid model "
        "whose checkpoints were evicted or invalidated, --ctx-checkpoints too low for the turns in flight, "
        "or a prompt cache (--cache-ram) too small or off. Dashboard: Request latency.",
    )
