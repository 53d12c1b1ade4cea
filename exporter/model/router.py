"""llama-server's router mode in one log: the router's own lines and one `ServerState` per child. Pure.

A router (`llama-server --models-dir DIR` or `--models-preset FILE`, b7218+) runs one child server per
loaded model and writes each child's lines into its own log as `[PORT] line`:

    0.03.218.682 I srv          load: spawning server instance with name=alpha on port 58071
    [58071] 0.00.002.135 I srv  llama_server: initializing ...
    [58071] 0.00.017.332 I srv    load_model: initializing, n_slots = 2, n_ctx_slot = 1024, kv_unified = 'true'
    0.17.514.381 I srv        unload: stopping model instance name=beta
    0.17.570.302 I srv           run: instance name=beta exited with status 0

`exporter.logs.router_split` splits a batch of lines by that prefix and parses each part;
`ServerLog.apply` takes those parts. The router's own lines (or, before any spawn line, a plain
llama-server's) go to `main`. A child's lines go to the child spawned on that port, whose state is a
fresh `ServerState` from the spawn line to its exit line. A child that exits is dropped with its
series; the router counts how children ended. A new router start (its own
`initializing ...`) ends every child.

The number of children followed is bounded (`MAX_CHILDREN`): a spawn past it is refused, said once by
the caller (`refused_names`), counted, and its lines are rejected (`unfollowed`) like any line the
exporter cannot place. So are `[PORT]` lines of a port no spawn line announced: only the router's own
line creates a child, which a client writing into a child's log cannot forge (the router prefixes
every line of a child's output, so a child's part never carries a router event). Before the first spawn
line, children's parts go to `main`, as they always have: a log of one child, or a plain server's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from exporter.logs import events as ev
from exporter.model.state import ServerState

#: Router children followed at most per router (and so at most this many `model` label values per server).
MAX_CHILDREN = 64
#: How a child ended: `unloaded` after the router's stop line, `crashed` without one.
EXIT_OUTCOMES = ("unloaded", "crashed")
ROUTER_EVENTS = frozenset({ev.RouterMode, ev.ChildSpawned, ev.ChildStopping, ev.ChildExited})


@dataclass
class RouterChild:
    """One child server of a router: its model name, port and log state."""

    name: str
    port: int
    state: ServerState
    stopping: bool = False  # the router asked it to stop (an unload)


@dataclass
class RouterLog:
    """The router's view of its children, from its log lines."""

    limit: int = MAX_CHILDREN
    active: bool = False  # this run is a router's (its router-mode line, or a spawn line)
    children: dict[int, RouterChild] = field(default_factory=dict)  # port → child
    starts: int = 0
    exits: Counter[str] = field(default_factory=Counter)
    refused: int = 0
    refused_names: list[str] = field(default_factory=list)  # refused since the caller last looked (bounded)

    def by_name(self, name: str) -> RouterChild | None:
        return next((c for c in self.children.values() if c.name == name), None)


class ServerLog:
    """Where the events of each line of one log go: `main`, or the router child its `[PORT]` prefix names."""

    def __init__(self, main: ServerState, *, limit: int = MAX_CHILDREN) -> None:
        self.main = main
        self.router = RouterLog(limit=limit)
        self.counting = True

    # -- counting (off while the existing log is replayed) --------------------------------------
    def set_counting(self, counting: bool) -> None:
        self.counting = counting
        self.main.counting = counting
        for child in self.router.children.values():
            child.state.counting = counting

    # -- applying ---------------------------------------------------------------------------------
    def apply(self, parts: Iterable[tuple[int | None, Sequence[ev.Event]]]) -> list[ev.Event]:
        """Apply a batch's events, in parts by where their lines came from (`exporter.logs.router_split`):
        `None` for the router's own lines, a port for a child's. Returns the events, children's included
        (for the caller's own checks)."""
        out: list[ev.Event] = []
        for port, events in parts:
            if port is None:
                self._main(events)
                out.extend(events)
            else:
                out.extend(self._child(port, events))
        return out

    def _child(self, port: int, events: Sequence[ev.Event]) -> list[ev.Event]:
        """A child's events: to its child; before router mode (a log of one child), to `main`. Either way,
        never a router event: only the router writes those, without a prefix."""
        kept = [e for e in events if type(e) not in ROUTER_EVENTS]
        if not self.router.active:
            self._main(kept)
            return kept
        child = self.router.children.get(port)
        if child is None:
            if self.counting:  # (counted as every reason is: the lines that carry an event)
                self.main.rejected["unfollowed"] += sum(1 for e in kept if type(e) is not ev.LineFormat)
            return kept
        child.state.apply_events(kept)
        return kept

    def _main(self, events: Sequence[ev.Event]) -> None:
        """The events of the log's own lines: the state's, in runs up to each router event; once the log is a
        router's, one by one (a start of its own ends its children)."""
        main, i, n = self.main, 0, len(events)
        while i < n:
            if not self.router.active:
                i = main.apply_events(events, i, ROUTER_EVENTS)
                if i == n:
                    return
            self._main_event(events[i])
            i += 1

    def _main_event(self, e: ev.Event) -> None:
        main = self.main
        kind = type(e)
        if kind in ROUTER_EVENTS:
            # The router's lines are checked like any other: written the way its run writes lines.
            reason = main.provenance.check(main.run, kind, e)
            if reason is not None:
                main.reject(reason)
            else:
                self._router_event(e)  # type: ignore[arg-type]
        elif main.apply(e) and kind is ev.ServerStarting and self.router.active:
            self._router_restarted()

    def _router_event(self, e: ev.RouterMode | ev.ChildSpawned | ev.ChildStopping | ev.ChildExited) -> None:
        r = self.router
        if isinstance(e, ev.RouterMode):
            if not self.main.run.ready:  # said at start, before the router listens
                r.active = True
        elif isinstance(e, ev.ChildSpawned):
            if not 0 < e.port < 65536:
                self.main.reject("out_of_range")
                return
            r.active = True
            same = r.by_name(e.name)  # the router runs one instance per name: an old one is gone
            if same is not None:
                del r.children[same.port]
            if e.port not in r.children and len(r.children) >= r.limit:
                if self.counting:
                    r.refused += 1
                if len(r.refused_names) < 16:
                    r.refused_names.append(e.name)
                return
            state = ServerState(counting=self.counting)
            state.capacity_override = self.main.capacity_override  # --kv-pool-capacity: for every server
            r.children[e.port] = RouterChild(e.name, e.port, state)
            if self.counting:
                r.starts += 1
        elif isinstance(e, ev.ChildStopping):
            child = r.by_name(e.name)
            if child is not None:
                child.stopping = True
        else:
            child = r.by_name(e.name)
            if child is None:
                return
            del r.children[child.port]
            if self.counting:  # a child has no reason to end unasked: without the stop line it is a crash
                r.exits["unloaded" if child.stopping else "crashed"] += 1

    def _router_restarted(self) -> None:
        """A new router process: its children died with the old one (not counted as exits: the router ended)."""
        self.router.children.clear()
        self.router.active = False
