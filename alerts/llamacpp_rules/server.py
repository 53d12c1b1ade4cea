"""The server's alerts: llama-server down or in a restart loop."""

from __future__ import annotations

from dataclasses import dataclass

from llamacpp_rules.builder import SERVER, Alerts, Rule, Rules


@dataclass(frozen=True)
class Settings:
    """The settings of these alerts: part of `Config` (`generate_rules.py --list`, `--set`)."""

    #: LlamaCppServerDown: llama-server has not answered /health (and is not loading) for this long.
    server_down_for: str = "1m"
    #: LlamaCppServerRestarting: at least this many server starts within the window. It and LlamaCppServerDown
    #: are one page per crash loop: whichever fires first holds it (the other stays quiet while it fires), and
    #: both keep firing for restarts_window after their condition ends.
    restarts_count: int = 3
    restarts_window: str = "15m"
    restarts_for: str = "1m"


#: These alerts, in the rules file's order (`document.MODULES`).
ALERTS = Alerts()

DOWN = "LlamaCppServerDown"
RESTARTING = "LlamaCppServerRestarting"


def _quiet_while(alert: str) -> str:
    """One page per crash loop: quiet while the other one of the pair fires."""
    return f'unless on ({SERVER}) ALERTS{{alertname="{alert}", alertstate="firing"}}'


@ALERTS.add
def server_down(r: Rules) -> Rule:
    """LlamaCppServerDown (critical): llama-server does not answer /health."""
    c, m = r.cfg, r.m
    return r.alert(
        DOWN,
        f"{r.last_two(m('llamacpp_up'), '==', '0')}\nunless {m('llamacpp_server_loading')} == 1\n"
        + _quiet_while(RESTARTING),
        c.server_down_for,
        "critical",
        "llama-server<WHO> does not answer /health.",
        "llama-server behind {{ $labels.instance }}<WHO> has not answered /health with 200 for "
        f"{c.server_down_for} and is not loading a model. Check the service (systemctl status, "
        "kubectl describe pod) and the end of its log for the crash or the bind error; restart it. If it "
        f"keeps crashing, this page stays up for {c.restarts_window} after each down spell (one page per crash "
        "loop; LlamaCppServerRestarting stays quiet meanwhile).",
        keep_firing_for=c.restarts_window,
    )


@ALERTS.add
def server_restarting(r: Rules) -> Rule:
    """LlamaCppServerRestarting (critical): a crash or restart loop."""
    c, m = r.cfg, r.m
    return r.alert(
        RESTARTING,
        f"increase({m('llamacpp_server_starts_total')}[{c.restarts_window}]) >= {c.restarts_count}\n"
        + _quiet_while(DOWN),
        c.restarts_for,
        "critical",
        "llama-server<WHO> is restarting over and over (crash or restart loop).",
        'llama-server behind {{ $labels.instance }}<WHO> started {{ printf "%.0f" $value }} times in the last '
        f"{c.restarts_window}. Every start drops all requests and the prompt cache. Read the last lines "
        "before each start in the log (out of memory, a failed allocation with a too large -c, an "
        "abort); stop the loop (systemctl stop) before it hides the cause, fix it, start again.",
        keep_firing_for=c.restarts_window,
    )
