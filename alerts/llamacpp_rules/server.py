"""The server's alerts: llama-server down or in a restart loop, a router's children refused or crashed."""

from __future__ import annotations

from llamacpp_rules.builder import SERVER, Rule, Rules
from llamacpp_rules.text import COUNT

DOWN = "LlamaCppServerDown"
RESTARTING = "LlamaCppServerRestarting"


def _quiet_while(alert: str) -> str:
    """One page per crash loop: quiet while the other one of the pair fires."""
    return f'unless on ({SERVER}) ALERTS{{alertname="{alert}", alertstate="firing"}}'


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


def router_children_refused(r: Rules) -> Rule:
    """LlamaCppRouterChildrenRefused: a router runs more children than the exporter follows."""
    c, m = r.cfg, r.m
    return r.alert(
        "LlamaCppRouterChildrenRefused",
        f"increase({m('llamacpp_router_children_refused_total')}[{c.router_event_window}]) > 0",
        "0m",
        "warning",
        "The llama-server router<WHO> runs more children than llamacpp-exporter follows.",
        "The llama-server router behind {{ $labels.instance }}<WHO> started "
        f"{COUNT} child servers (one per loaded model) in the last {c.router_event_window} beyond the "
        "number llamacpp-exporter follows (llamacpp_router_children_limit): their slots, KV pools and "
        "crashes are not watched and no alert fires for them. Keep the models loaded at once within "
        "that limit with the router's --models-max (0 = unlimited), or split the models over more "
        "routers.",
    )


def router_child_crashed(r: Rules) -> Rule:
    """LlamaCppRouterChildCrashed: a router's child server exited without being unloaded."""
    c, m = r.cfg, r.m
    crashed = m("llamacpp_router_child_exits_total", 'outcome="crashed"')
    return r.alert(
        "LlamaCppRouterChildCrashed",
        f"increase({crashed}[{c.router_event_window}]) > 0",
        "0m",
        "warning",
        "A child server of the llama-server router<WHO> crashed.",
        "A child server (one loaded model) of the llama-server router behind {{ $labels.instance }}<WHO> "
        f"exited without being unloaded in the last {c.router_event_window} (count: {COUNT}): the "
        "requests it served failed, and the router starts the model again at its next request. Read the "
        "child's last lines in the router's log (they carry its port, [PORT]) for the cause: out of "
        "memory (models that share a GPU: dashboard GPU memory by server), a failed allocation at load, "
        "an abort. Load fewer models at once (--models-max) or give them a smaller -c.",
    )
