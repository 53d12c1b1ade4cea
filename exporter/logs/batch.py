"""A batch of log lines as the parser scans them: each line after a "\\n", all in one text. Pure.

A reader (the tailer, standard input, the journal) adds a read's lines to a `LineBatch` one by one or as
a block of decoded text; the parser scans the batch's `text` (`joined`), and splits it into lines only if
something asks for them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import overload


class LineBatch(Sequence[str]):
    """Lines read together (a file's poll), held as the text the parser scans: each line after a "\\n".

    A reader adds lines one by one (`append`) or a block of them as its decoded text (`add_text`); the
    batch's `text` is then one join of those pieces, and its lines are split out only if something asks for
    them (a router's prefixes, JSONL or colours to unwrap): a plain log is parsed without a `str` per line.
    """

    __slots__ = ("_count", "_lines", "_pieces", "_text")

    def __init__(self) -> None:
        self._pieces: list[str] = []  # lines, or blocks of lines joined by "\\n"
        self._count = 0
        self._text: str | None = None
        self._lines: list[str] | None = None

    def append(self, line: str) -> None:
        """One line (without its "\\n")."""
        self._pieces.append(line)
        self._count += 1
        self._text = self._lines = None

    def extend(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.append(line)

    def add_text(self, text: str, count: int) -> None:
        """`count` lines joined by "\\n" (so `count - 1` of them in `text`)."""
        self._pieces.append(text)
        self._count += count
        self._text = self._lines = None

    @property
    def text(self) -> str:
        """What the parser scans: "\\n" before each line, all joined ("" for no line)."""
        if self._text is None:
            self._text = "\n".join(["", *self._pieces]) if self._count else ""
        return self._text

    def lines(self) -> list[str]:
        """The lines, split out of the text on first use."""
        if self._lines is None:
            self._lines = [line for piece in self._pieces for line in piece.split("\n")]
        return self._lines

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> list[str]: ...
    def __getitem__(self, index: int | slice) -> str | list[str]:
        return self.lines()[index]

    def __iter__(self) -> Iterator[str]:
        return iter(self.lines())

    def __repr__(self) -> str:
        return f"LineBatch({self.lines()!r})"


def joined(lines: Sequence[str]) -> str:
    """What the parser scans of `lines`: a batch's own text, or "\\n" before each line, all joined."""
    return lines.text if isinstance(lines, LineBatch) else "\n".join(["", *lines])
