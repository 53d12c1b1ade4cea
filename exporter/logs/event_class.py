"""How an event class is made (`@event`): a slotted dataclass, immutable to the type checker, cheap to build,
with its traits (`Traits`) declared once on the class.

Every class in `exporter.logs.events` is made this way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypeVar, cast

_T = TypeVar("_T")

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform  # typing has it from 3.11 on; mypy knows both
else:

    def dataclass_transform(**_: object) -> Callable[[_T], _T]:
        return lambda decorated: decorated


class Traits(NamedTuple):
    """What an event kind is to the model and to `diagnose`, declared on its class as `TRAITS = Traits(...)`.

    Every set of kinds the consumers test (`type(e) in …`) is derived from these at import
    (`exporter.logs.events`), so a new kind says once what it is. Whether a kind carries a slot is not
    declared: it has a `slot` field (`carries_slot`), and the model bounds every such kind.
    """

    #: The requests in flight may grow after it (a prompt or progress), or shrink (a release, a failed decode).
    demand: Literal["grows", "shrinks"] | None = None
    #: A slot line about a task's progress (`diagnose` keeps its run's clock and slots current with it).
    progress: bool = False
    #: A slot line about the slot's current task, checked by the state's handlers for its provenance.
    task_line: bool = False
    #: The pool series (`diagnose --html`) takes a point after it.
    series: bool = False
    #: Part of an abort's trail of lines (the aborted requests' errors and releases): it does not end it.
    abort_trail: bool = False
    #: Each event of this kind counts one (while the state counts) in `ServerState.counted`, exported by the
    #: catalogue's counter that names the kind (`Family.event`): no handler, state field or collector line.
    counted: bool = False


NO_TRAITS = Traits()


def traits(kind: type) -> Traits:
    """The traits an event class declared (`NO_TRAITS` when it declared none)."""
    return cast(Traits, kind.__dict__["TRAITS"])


def carries_slot(kind: type) -> bool:
    """The kind names a slot (a `slot` field): the model bounds it by the slots the running server has."""
    return any(f.name == "slot" for f in fields(kind))


@dataclass_transform(frozen_default=True)
def event(cls: type[_T]) -> type[_T]:
    """An event class: a slotted dataclass, immutable to the type checker.

    Not ``frozen=True`` at run time: a frozen dataclass sets each field through
    ``object.__setattr__``, which makes building an event about three times slower (~400 ns
    against ~125 ns for three fields), and a busy log builds hundreds of thousands per second.
    mypy still rejects any assignment to a field; nothing assigns one.

    Only ``__init__`` is generated per class (it is the hot path); ``__repr__``, ``__eq__`` and
    ``__hash__`` are shared functions over the fields, the same as dataclass's: generating and
    compiling them for each of some fifty classes cost about 100 KiB of resident memory.
    """
    if any(name in cls.__dict__ for name in ("__repr__", "__eq__", "__hash__")):
        raise TypeError(f"{cls.__name__}: an event class gets its __repr__, __eq__ and __hash__ from @event")
    made: Any = dataclass(slots=True, repr=False, eq=False)(cls)
    if not isinstance(made.__dict__.get("TRAITS", NO_TRAITS), Traits):
        raise TypeError(f"{cls.__name__}: TRAITS must be a Traits")
    made.TRAITS = made.__dict__.get("TRAITS", NO_TRAITS)
    made.__repr__ = _repr(tuple(f.name for f in fields(made) if f.repr))
    made.__eq__ = _eq(tuple(f.name for f in fields(made) if f.compare))
    made.__hash__ = _hash(tuple(f.name for f in fields(made) if (f.compare if f.hash is None else f.hash)))
    return cast("type[_T]", made)


def _repr(names: tuple[str, ...]) -> Callable[[object], str]:
    """dataclass's `__repr__` for these fields: `KVRetry(offset=0, n_batch=512)`."""

    def __repr__(self: object) -> str:
        values = ", ".join(f"{name}={getattr(self, name)!r}" for name in names)
        return f"{type(self).__qualname__}({values})"

    return __repr__


def _eq(names: tuple[str, ...]) -> Callable[[object, object], bool]:
    """dataclass's `__eq__` over these fields: the same class, and the fields' tuples equal."""

    def __eq__(self: object, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return tuple(getattr(self, n) for n in names) == tuple(getattr(other, n) for n in names)

    return __eq__


def _hash(names: tuple[str, ...]) -> Callable[[object], int]:
    """dataclass's `__hash__` (unsafe_hash) over these fields."""

    def __hash__(self: object) -> int:
        return hash(tuple(getattr(self, n) for n in names))

    return __hash__
