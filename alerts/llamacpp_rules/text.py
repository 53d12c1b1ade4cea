"""Text pieces of the alerts' annotations: who an alert is about, figures read back from Prometheus, numbers."""

from __future__ import annotations

#: "none": the Watchdog only (always firing; routed to a dead man's switch, never to a person).
SEVERITIES = ("critical", "warning", "info", "none")
#: A counter increase for a description: increase() extrapolates, so round it.
COUNT = '{{ printf "%.0f" $value }}'
#: Which llama-server an alert is about, when one exporter follows several: " (server gpu0, model alpha)",
#: " (server gpu0)", " (model alpha)" (a router's child) or nothing (one server: no such labels).
WHO = (
    "{{ if or $labels.server $labels.model }} ("
    "{{ with $labels.server }}server {{ . }}{{ if $labels.model }}, {{ end }}{{ end }}"
    "{{ with $labels.model }}model {{ . }}{{ end }}"
    "){{ end }}"
)
#: Where WHO goes in an alert's summary and description (Rules.alert puts it in).
W = "<WHO>"
#: The matchers of the alert's own server (job, instance, server, model; an absent label matches its absence),
#: for the `query` of a figure in a description. Rendered once at the start of the description.
THIS = (
    '{{ $this := printf "job=%q, instance=%q, server=%q, model=%q" '
    "$labels.job $labels.instance $labels.server $labels.model }}"
)


def figure(series: str, fmt: str, missing: str, extra: str = "", before: str = "", after: str = "") -> str:
    """A template that prints the alert's server's ``series`` (formatted by ``fmt``) between ``before`` and
    ``after``, or ``missing`` where the series is absent."""
    matchers = "%s" + (f", {extra}" if extra else "")
    return (
        f"{{{{ with printf `{series}{{{matchers}}}` $this | query }}}}{before}{{{{ . | first | value | {fmt} }}}}"
        f"{after}{{{{ else }}}}{missing}{{{{ end }}}}"
    )


def num(x: float) -> str:
    """0.9 -> '0.9', 1.0 -> '1', 536870912 -> '536870912' (PromQL number literals)."""
    return f"{x:g}" if isinstance(x, float) and not float(x).is_integer() else str(int(x))
