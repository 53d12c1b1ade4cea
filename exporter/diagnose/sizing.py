"""Was the pool big enough over a whole history, and the one size to give it (pure).

A failure is the fact: the aborted slots held so many cells together in a pool that could not hold
them, so a pool smaller than that sum would have failed there too (a floor). The requests' p99 size
times their p99 number in flight together is the usual peak; the slots' promises (slots x window) is
the pool where no request can abort another. The recommendation is one size, the largest of the
floor, the usual peak and the failed pool plus one cell, with its KV memory at the cache types in use.
"""

from __future__ import annotations

from collections.abc import Sequence

from exporter.diagnose.report import Configuration, PoolSizing, RunSummary
from exporter.model.request_sizes import RequestSummary


def size_pool(runs: Sequence[RunSummary], requests: RequestSummary | None) -> PoolSizing | None:
    """The history's pool verdict; None when no run had a request or a failure.

    >>> from exporter.diagnose.report import RunSummary
    >>> r = RunSummary(1, "f", None, 1, 9, "clean", 1, 3, 0, 70_000, None, pool_cells=131_072,
    ...                held_at_failure=131_500, held_at_failure_line=7)
    >>> s = size_pool([r], None)
    >>> s.verdict, s.overflow, s.recommended, s.recommended_from
    ('too_small', 428, 131500, 'floor')
    """
    failed = [r for r in runs if r.failures]
    if requests is None and not failed:
        return None
    held_run = max((r for r in failed if r.held_at_failure), key=lambda r: r.held_at_failure or 0, default=None)
    pools = [r.pool_cells for r in runs if r.pool_cells]
    pool = held_run.pool_cells if held_run is not None and held_run.pool_cells else (max(pools) if pools else None)
    held = held_run.held_at_failure if held_run is not None else None
    p99 = requests.pool_needed if requests is not None else None
    candidates: list[tuple[int, str]] = []
    if held:
        candidates.append((held, "floor"))
    if p99 is not None:
        candidates.append((p99, "p99_x_p99"))
    failed_pools = [r.pool_cells for r in failed if r.pool_cells]
    if failed_pools:
        candidates.append((max(failed_pools) + 1, "pool_plus_one"))  # it overflowed: it was not enough
    if failed:
        verdict = "too_small"
    elif p99 is not None and pool is not None:
        verdict = "too_small" if p99 > pool else "enough"
    else:
        verdict = "unknown"
    recommended = max(candidates, key=lambda c: c[0]) if candidates and verdict == "too_small" else None
    config = _config_of(held_run, runs)
    promised = None
    if config is not None and config.n_slots and config.n_ctx_slot:
        promised = config.n_slots * config.n_ctx_slot
    per_cell = config.kv_bytes_per_cell if config is not None else None
    kv = None
    if recommended is not None and per_cell is not None and config is not None:
        kv = round(per_cell * recommended[0] + (config.swa_kv_bytes or 0))
    return PoolSizing(
        verdict=verdict,
        pool_cells=pool,
        overflowed=bool(failed),
        held_at_failure=held,
        held_run=held_run.index if held_run is not None else None,
        held_line=held_run.held_at_failure_line if held_run is not None else None,
        overflow=held - pool if held is not None and pool is not None else None,
        p99_x_p99=p99,
        promised=promised,
        recommended=recommended[0] if recommended else None,
        recommended_from=recommended[1] if recommended else None,
        type_k=config.type_k if config is not None else None,
        type_v=config.type_v if config is not None else None,
        kv_bytes_per_cell=per_cell,
        recommended_kv_bytes=kv,
        kv_bytes_now=config.kv_bytes if config is not None else None,
    )


def _config_of(held_run: RunSummary | None, runs: Sequence[RunSummary]) -> Configuration | None:
    """The configuration that sizes the advice: the run that held the most at a failure, else the last
    run whose log measured its KV cache, else the last run."""
    if held_run is not None and held_run.configuration is not None:
        return held_run.configuration
    measured = [r.configuration for r in runs if r.configuration is not None and r.configuration.kv_bytes_per_cell]
    if measured:
        return measured[-1]
    known = [r.configuration for r in runs if r.configuration is not None]
    return known[-1] if known else None


def config_of(runs: Sequence[RunSummary], sizing: PoolSizing | None) -> Configuration | None:
    """The configuration the history's sizing was made for (see `size_pool`)."""
    if sizing is None:
        return None
    held = next((r for r in runs if r.index == sizing.held_run), None)
    return _config_of(held, runs)
