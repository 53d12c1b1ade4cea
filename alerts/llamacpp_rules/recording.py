"""The recording rules: per-server sums and the day's p99 sizes the alerts and the dashboard read."""

from __future__ import annotations

from llamacpp_rules.builder import BUSY, KNOWN, SEEN, Rule, Rules


def recording(r: Rules) -> list[Rule]:
    """Every recording rule, in the order of the rules file."""
    m, known, seen = r.m, KNOWN, SEEN
    window = r.cfg.undersized_window

    def p99(histogram: str) -> str:
        # One histogram per server: every label but `le` is kept, server and model included.
        return f"histogram_quantile(0.99, rate({m(histogram + '_bucket')}[{window}]))"

    return [
        # What the requests of the last day asked of the pool: the p99 request's cells, the p99 number of
        # requests in flight together, and their product (the pool that would have held them).
        {"record": f"instance:llamacpp_request_tokens:p99_{window}", "expr": p99("llamacpp_request_tokens")},
        {
            "record": f"instance:llamacpp_request_concurrency:p99_{window}",
            "expr": p99("llamacpp_request_concurrency"),
        },
        {
            "record": f"instance:llamacpp_kv_pool_needed_tokens:p99_{window}",
            "expr": (
                f"instance:llamacpp_request_tokens:p99_{window}\n* instance:llamacpp_request_concurrency:p99_{window}"
            ),
        },
        {
            "record": BUSY,
            "expr": f"sum without (slot) ({m('llamacpp_slot_processing')})",
        },
        {
            # Host RAM that llama-server holds for context checkpoints plus its prompt cache. A server
            # without checkpoint series (no slots yet) still gets its prompt cache counted.
            "record": "instance:llamacpp_host_cache_bytes:sum",
            "expr": (
                f"(sum without (slot) ({m('llamacpp_checkpoint_bytes')})"
                f" or {m('llamacpp_prompt_cache_bytes')} * 0)\n"
                f"+ {m('llamacpp_prompt_cache_bytes')}"
            ),
        },
        {
            # The targets that are llamacpp-exporters: those scraped now, and, reading this rule's own
            # previous result, those that were and that service discovery still lists (their `up` is
            # there, 0 or 1). A lookback window would forget a target that stays down for longer.
            "record": known,
            "expr": (
                f"group by (job, instance) ({m('llamacpp_exporter_build_info')})\n"
                f"or ({known} and on (job, instance) up)"
            ),
        },
        {
            # Per job: when a llamacpp-exporter of it was last scraped; kept (this rule reads its own
            # previous result) until exporter_forget_after has passed.
            "record": seen,
            "expr": (
                f"max by (job) (timestamp({m('llamacpp_exporter_build_info')}))\nor ({seen} > time() - {r.forget_s})"
            ),
        },
    ]
