"""What `diagnose` keeps of a run besides its report: the fingerprint that tells one run read twice, and the
pool series that `--html` plots."""

from __future__ import annotations

import bisect
import hashlib
from typing import Any

from exporter.logs.router_split import PREFIX

#: A run's first lines with an event are hashed at these counts (see `Fingerprint`).
FINGERPRINT_LINES = (16, 32)


class Fingerprint:
    """A run's first lines with an event (without a router prefix), hashed after 16 and 32 of them.

    Two runs from different files whose first lines hash alike are one run read twice: a copy of a
    log taken while it was still being written, or the journal and a --log-file of the same process.
    Only runs whose lines carry time stamps can be told apart this way (without them two starts of the
    same server print the same lines), so `stamped` says whether every line hashed had one.
    """

    __slots__ = ("_hash", "_last", "digests", "lines", "stamped")

    def __init__(self) -> None:
        self._hash: Any = hashlib.blake2b(digest_size=16)
        self._last = -1
        self.lines = 0
        self.digests: dict[int, bytes] = {}
        self.stamped = True

    def add(self, lineno: int, line: str) -> None:
        if lineno == self._last or self._hash is None:
            return
        self._last = lineno
        if line[:1] == "[" and (m := PREFIX.match(line)) is not None:
            line = line[m.end() :]
        first = line[:1]
        if self.stamped and not ("0" <= first <= "9" or (first == "{" and '"time"' in line)):
            self.stamped = False
        self._hash.update(line.rstrip("\r\n").encode("utf-8", "surrogatepass") + b"\n")
        self.lines += 1
        if self.lines in FINGERPRINT_LINES:
            self.digests[self.lines] = self._hash.digest()
            if self.lines == FINGERPRINT_LINES[-1]:
                self.close()

    def close(self) -> None:
        """No more lines: the hash's state is let go (a history keeps one fingerprint per run)."""
        self._hash = None

    def same_run(self, other: Fingerprint) -> bool:
        """Both hold the same first lines, as many as the shorter one has (at least 16), with stamps."""
        n = min(self.lines, other.lines)
        common = [c for c in FINGERPRINT_LINES if c <= n]
        return bool(common) and self.stamped and other.stamped and self.digests[common[-1]] == other.digests[common[-1]]


class PoolSeries:
    """The tokens each slot held over one run, for `diagnose --html`: x is seconds since the start
    (the log's time stamps) or, without stamps, line numbers.

    Bounded: at most `MAX_POINTS`; when full, every other point is dropped and from then on only
    every second change is kept, so the whole run stays covered evenly.

    x is the log's own time stamp (seconds since the server started, as the text's failures say), not
    shifted, so that the page and the text share one time origin. Each failure is kept apart (at most
    `MAX_FAILURES`) with the cells the text counts for it: each aborted slot's release line.
    """

    MAX_POINTS = 2000
    MAX_FAILURES = 200

    __slots__ = ("_every", "_seen", "by_line", "failures", "tokens", "x")

    def __init__(self) -> None:
        self.x: list[float] = []
        self.tokens: list[tuple[int, ...]] = []
        self.failures: list[tuple[float, tuple[int, ...]]] = []
        self.by_line = False
        self._every = 1
        self._seen = 0

    def add_failure(self, x: float, tokens: tuple[int, ...]) -> None:
        if len(self.failures) < self.MAX_FAILURES:
            self.failures.append((x, tokens))

    def points(self) -> tuple[list[float], list[tuple[int, ...]]]:
        """What the chart plots: the samples with each failure's point after the samples at or before
        its x (so that, drawn as steps, the stack at a failure is what the text counts)."""
        xs, tokens = list(self.x), list(self.tokens)
        for fx, ft in self.failures:
            i = bisect.bisect_right(xs, fx)
            xs.insert(i, fx)
            tokens.insert(i, ft)
        return xs, tokens

    def as_json(self) -> dict[str, Any]:
        """The plotted series: x, and one list of cells per slot."""
        xs, tokens = self.points()
        width = max((len(t) for t in tokens), default=0)
        return {
            "x_unit": "line" if self.by_line else "seconds since the server started",
            "x": xs,
            "slots": [[t[i] if i < len(t) else 0 for t in tokens] for i in range(width)],
            "failures": [x for x, _ in self.failures],
        }

    def add(self, x: float, tokens: tuple[int, ...], *, keep: bool = False) -> None:
        self._seen += 1
        if not keep and self._seen % self._every:
            return
        self.x.append(x)
        self.tokens.append(tokens)
        if len(self.x) >= self.MAX_POINTS:
            del self.x[1::2], self.tokens[1::2]
            self._every *= 2
