"""How an event class is made (`@event`): a slotted dataclass, immutable to the type checker, cheap to build.

Every class in `exporter.logs.events` is made this way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, TypeVar, cast

_T = TypeVar("_T")

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform  # typing has it from 3.11 on; mypy knows both
else:

    def dataclass_transform(**_: object) -> Callable[[_T], _T]:
        return lambda decorated: decorated


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
