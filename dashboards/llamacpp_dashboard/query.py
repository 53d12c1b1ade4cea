"""Queries: the datasource, the matchers every query carries and a Prometheus target."""

from __future__ import annotations

from typing import Any

DS = {"type": "prometheus", "uid": "${datasource}"}
#: Matchers every query carries (dashboard-linter target-job-rule / target-instance-rule): ``{G}``, for
#: the series that are one per host or exporter (GPU and host memory, Prometheus' up).
GLOBAL_SEL = '{job=~"$job", instance=~"$instance"}'
#: ``{R}``: a router's own series (children, starts, exits), labelled ``server`` when one exporter follows
#: several servers.
ROUTER_SEL = '{job=~"$job", instance=~"$instance", server=~"$server"}'
#: ``{S}``: everything about one llama-server (slots, pool, counters, up, sources). Several servers on one
#: exporter carry ``server``, a router's children ``model``; a series without the label matches ``.*`` (All).
SEL = '{job=~"$job", instance=~"$instance", server=~"$server", model=~"$model"}'
SELECTORS = {"S": SEL, "G": GLOBAL_SEL, "R": ROUTER_SEL}
#: ``{BY}``: what a per-server aggregation keeps, so that several servers and models stay apart.
BY = "instance, server, model"
#: ``{W}`` in a legend: which server a per-server series is (a label that is absent renders empty).
WHO = "{{instance}} {{server}} {{model}}"
#: The KV pool panels' titles name the model(s) selected ("All", "alpha", "alpha + beta").
OF_MODEL = " ($model)"


def selectors(expr: str) -> str:
    """``{S}``/``{G}``/``{R}`` become the matchers above (``{S, x="y"}`` adds one), ``{BY}`` the grouping."""
    for key, sel in SELECTORS.items():
        expr = expr.replace("{" + key + "}", sel).replace("{" + key + ", ", sel[:-1] + ", ")
    return expr.replace("{BY}", BY)


def q(expr: str, legend: str = "__auto", ref: str = "A", **extra: Any) -> dict[str, Any]:
    """A Prometheus target; ``expr`` with the markers of :func:`selectors`, ``{W}`` in ``legend``."""
    target: dict[str, Any] = {
        "datasource": DS,
        "editorMode": "code",
        "expr": selectors(expr),
        "legendFormat": legend.replace("{W}", WHO),
        "range": True,
        "refId": ref,
    }
    target.update(extra)
    return target
