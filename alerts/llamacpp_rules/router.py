"""A router's alerts: children it runs beyond what the exporter follows, a child that crashed."""

from __future__ import annotations

from dataclasses import dataclass

from llamacpp_rules.builder import Alerts, Rule, Rules
from llamacpp_rules.text import COUNT


@dataclass(frozen=True)
class Settings:
    """The settings of these alerts: part of `Config` (`generate_rules.py --list`, `--set`)."""

    #: LlamaCppRouterChildrenRefused / LlamaCppRouterChildCrashed: an event within this window.
    router_event_window: str = "15m"


#: These alerts, in the rules file's order (`document.MODULES`).
ALERTS = Alerts()


@ALERTS.add
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


@ALERTS.add
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
