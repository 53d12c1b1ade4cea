"""The pools the guard admits against: one server's, or a router's, one per model (`Pools`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from exporter.guard.admission import Pool


class Pools(Protocol):
    """Where the guard learns the pools: one server's, or (a router) each model's."""

    def key(self, model: str | None) -> str | None:
        """The pool a request for `model` goes to: None for a plain server, the model's name for a router."""

    def pool(self, key: str | None) -> Pool:
        """What that pool offers now."""


class OnePool:
    """A plain server's pool, from a function."""

    def __init__(self, pool: Callable[[], Pool]) -> None:
        self._pool = pool

    def key(self, model: str | None) -> str | None:
        return None

    def pool(self, key: str | None) -> Pool:
        return self._pool()
