"""Router mode: the router and its children (one llama-server per model)."""

from __future__ import annotations

from typing import TypeAlias

from exporter.logs.event_class import event


@event
class RouterMode:
    """`starting server in router mode` (b11434): this server is a router; its children follow."""


@event
class ChildSpawned:
    """Router mode (b7218+): `spawning server instance with name=NAME on port PORT`; the child's own lines
    follow in the router's log as `[PORT] line`."""

    name: str
    port: int


@event
class ChildStopping:
    """Router mode: `stopping model instance name=NAME` (an unload, or a model evicted by --models-max)."""

    name: str


@event
class ChildExited:
    """Router mode: `instance name=NAME exited with status N` (the child process ended)."""

    name: str
    status: int


#: The kinds of this family (`exporter.logs.events.Event` is the union of the families').
RouterEvent: TypeAlias = RouterMode | ChildSpawned | ChildStopping | ChildExited

__all__ = ["ChildExited", "ChildSpawned", "ChildStopping", "RouterEvent", "RouterMode"]
