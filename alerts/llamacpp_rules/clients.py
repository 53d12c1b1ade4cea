"""Who holds the pool, in the overflow alerts' descriptions: the client whose requests held the most KV cells
over the last minutes, from the guard's books (``llamacpp_guard_client_pool_tokens``, one series per client,
filtered by the alert's job and instance: the guard's series carry no ``server`` or ``model``). Without the
guard there is no such series and the sentence is left out; the rest of the description is unchanged."""

from __future__ import annotations

#: The window over which the largest holder is taken: an abort frees the cells at once, so "now" would name
#: nobody by the time its alert fires.
HOLDER_WINDOW = "5m"

LARGEST_HOLDER = (
    "{{ with printf `topk(1, max_over_time(llamacpp_guard_client_pool_tokens{job=%q, instance=%q}"
    f"[{HOLDER_WINDOW}]) > 0)` "
    "$labels.job $labels.instance | query }}"
    ' Largest holder in the last 5 minutes (the guard\'s books): client {{ . | first | label "client" }} with '
    '{{ . | first | value | printf "%.0f" }} cells (dashboard: Who holds the pool).'
    "{{ end }}"
)
