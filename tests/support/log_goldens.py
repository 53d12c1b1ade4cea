"""The log goldens: for every recorded capture of every build, the log collectors' exposition after the
exporter followed it (`assembly.log_exposition`), one file each: tests/fixtures/golden/<build>/<capture>.prom
(the router's: golden/router/children-loaded.prom and end.prom; `-replayed`: the exporter
started after the server). tests/unit/test_exposition_golden.py compares them byte for byte.

A capture is a folder of tests/fixtures with a `llama-server.log` (its `capture.json`, where there is one,
says which logs the server wrote in order and whether each start truncated the file), and the router's
`router/router.log`. Re-record after a reviewed change of the exposition, and check without writing:

    $ .venv/bin/python tests/support/log_goldens.py --write
    $ .venv/bin/python tests/support/log_goldens.py --check
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

# Run as a script: its neighbours importable, and `exporter` this checkout's (first: a virtual environment
# shared with another checkout would otherwise give that one's, and the goldens of its code).
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from assembly import Assembly, followed, log_exposition
from paths import FIXTURES

GOLDEN = FIXTURES / "golden"


@dataclass(frozen=True)
class Capture:
    """One recorded server run (or a restart's runs) and where its golden file is."""

    folder: Path
    logs: tuple[str, ...]  # the logs the server wrote, in order (a restart's earlier one first)
    truncated_at_start: bool  # each start empties the file (--log-file); False: it only grows (stderr)
    until: int | None = None  # the scrape after this many lines of the last log (None: all of them)
    name: str = ""  # the golden file's name under the folder's, when there are several
    replayed: bool = False  # the exporter starts after the server: the file replayed without counting

    @property
    def id(self) -> str:
        folder = self.folder.relative_to(FIXTURES).as_posix()
        named = f"{folder}/{self.name}" if self.name else folder
        return named + ("-replayed" if self.replayed else "")

    @property
    def golden(self) -> Path:
        return GOLDEN / f"{self.id}.prom"

    def run_logs(self) -> list[bytes]:
        """The bytes of each server run the exporter follows, the last cut at `until`."""
        logs = [(self.folder / name).read_bytes() for name in self.logs]
        if self.until is not None:
            logs[-1] = b"".join(logs[-1].splitlines(keepends=True)[: self.until])
        return logs

    def followed(self, tmp: Path) -> contextlib.AbstractContextManager[Assembly]:
        """The assembled exporter after it followed this capture, as its golden file is made."""
        return followed(self.run_logs(), tmp, truncated_at_start=self.truncated_at_start, replayed=self.replayed)

    def exposition(self, tmp: Path) -> str:
        return log_exposition(self.run_logs(), tmp, truncated_at_start=self.truncated_at_start, replayed=self.replayed)


def _capture(folder: Path) -> Capture:
    recorded = folder / "capture.json"
    if not recorded.exists():  # the b11434 captures copied as they are: one log, one run
        return Capture(folder, ("llama-server.log",), True)
    data = json.loads(recorded.read_text(encoding="utf-8"))
    return Capture(folder, tuple(data["logs"]), bool(data["log_truncated_at_start"]))


#: The router's capture ends with no child running: scraped also where both run (before beta's unload, where
#: its /slots snapshots were taken: tests/fixtures/router/README.md), each child's families labelled.
ROUTER_LOADED = 648

#: Every capture: each build's folders with a server log (proc/ holds /proc trees, not a capture), the router's.
CAPTURES = [
    *(_capture(p.parent) for p in sorted(FIXTURES.glob("*/*/llama-server.log")) if p.parts[-3] != "proc"),
    Capture(FIXTURES / "router", ("router.log",), True, until=ROUTER_LOADED, name="children-loaded"),
    Capture(FIXTURES / "router", ("router.log",), True, name="end"),
]
#: The exporter's other start, after the server (the gauges rebuilt, no past event counted): an overflow,
#: a restart (only the last run is in the file) and an in-process one (both runs are), the router's children.
CAPTURES += [
    replace(c, replayed=True)
    for c in CAPTURES
    if c.id
    in (
        "b11434/exhaust-lv4",
        "b11434/restart-kill9",
        "xllamacpp-2026.10.11549/restart-kill9",
        "router/children-loaded",
    )
]
#: The builds recorded (tests/fixtures/<build>/, `scripts/record-build.sh`), the router's folder aside: the tests
#: that hold something of every build read them from here, so a new build's folder needs no list edited.
BUILDS: frozenset[str] = frozenset(c.id.split("/")[0] for c in CAPTURES) - {"router"}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="rewrite every golden file")
    ap.add_argument("--check", action="store_true", help="compare with the golden files (the default)")
    args = ap.parse_args(argv)
    logging.disable(logging.WARNING)  # the exporter's warnings about each capture's verbosity: not wanted here
    differ = []
    with tempfile.TemporaryDirectory() as tmp:
        for capture in CAPTURES:
            text = capture.exposition(Path(tmp))
            if args.write:
                capture.golden.parent.mkdir(parents=True, exist_ok=True)
                capture.golden.write_text(text, encoding="utf-8", newline="\n")
            elif not capture.golden.exists() or capture.golden.read_text(encoding="utf-8") != text:
                differ.append(capture.id)
    for name in differ:
        print(f"differs: {name}")
    print(f"{len(CAPTURES)} captures, {'written' if args.write else f'{len(differ)} differ'}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
