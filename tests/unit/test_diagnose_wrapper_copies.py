"""`diagnose` on a Windows wrapper's copies (`llama-server.stderr.prev-<time>`, numbered ones) whose times
were not kept (mailed, unzipped, `cp` without -p): ordered by the names, the current file last, said in
the report, and no restart loop made of equal times. The runs are real b11434 captures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from paths import FIXTURES
from windows_logs import variant

from exporter.diagnose import diagnose_files, input_files
from exporter.diagnose.render import render_text

RUNS = [FIXTURES / "b11434" / n / "llama-server.log" for n in ("exhaust-lv4", "pool-overflow-lv4", "checkpoints")]
CURRENT = FIXTURES / "b11434" / "recover-purge-lv4" / "llama-server.log"


def _write(folder: Path, names: list[str], times: list[float]) -> None:
    """The three old runs under `names` (oldest first) and the current one, as PowerShell 5.1 wrote them."""
    for name, source, t in zip([*names, "llama-server.stderr"], [*RUNS, CURRENT], times, strict=True):
        path = folder / name
        path.write_bytes(variant(source.read_bytes(), "powershell51"))
        os.utime(path, (t, t))


@pytest.mark.parametrize(
    ("names", "times"),
    [
        # Unzipped: one time for all (zip keeps 2 s).
        (["llama-server.stderr.prev-20261203-0701", "llama-server.stderr.prev-20261203-0912",
          "llama-server.stderr.prev-20261203-1130"], [1_800_000_000.0] * 4),
        # `cp` without -p, in the shell's (alphabetical) order: the current file gets the earliest time.
        (["llama-server.stderr.prev-1", "llama-server.stderr.prev-2", "llama-server.stderr.prev-10"],
         [1_800_000_000.3, 1_800_000_000.4, 1_800_000_000.2, 1_800_000_000.0]),
        # Numbered rotations, the highest the oldest.
        (["llama-server.stderr.3", "llama-server.stderr.2", "llama-server.stderr.1"], [1_800_000_000.0] * 4),
    ],
    ids=["unzipped", "cp-without-p", "numbered"],
)  # fmt: skip
def test_copies_without_their_times_are_ordered_by_name(tmp_path: Path, names: list[str], times: list[float]) -> None:
    _write(tmp_path, names, times)
    paths, order = input_files([str(tmp_path / "llama-server.stderr*")])
    assert [Path(p).name for p in paths] == [*names, "llama-server.stderr"]
    assert order is not None and "by the time stamp or number in their names" in order
    report = diagnose_files(paths)
    report.files_order = order
    assert report.runs_total == 4
    assert [Path(r.file).name for r in report.history] == [*names, "llama-server.stderr"]
    assert all(fs.modified is None for fs in report.by_file)  # the times say nothing: not used
    text = render_text(report)
    assert "Restart loop" not in text
    assert "by the time stamp or number in their names, the file without one last" in text


def test_kept_times_still_order_and_date_the_files(tmp_path: Path) -> None:
    """Copy-Item keeps LastWriteTime: distinct times order the files (even against their names) and date them;
    three starts within a minute is a restart loop."""
    names = ["llama-server.stderr.prev-b", "llama-server.stderr.prev-a", "llama-server.stderr.prev-c"]
    _write(tmp_path, names, [1_800_000_000.0, 1_800_000_010.0, 1_800_000_020.0, 1_800_000_030.0])
    paths, order = input_files([str(tmp_path / "llama-server.stderr*")])
    assert order == "by modification time, oldest first"
    assert [Path(p).name for p in paths] == [*names, "llama-server.stderr"]
    report = diagnose_files(paths)
    assert [fs.modified for fs in report.by_file] == [
        1_800_000_000.0,
        1_800_000_010.0,
        1_800_000_020.0,
        1_800_000_030.0,
    ]
    assert "Restart loop: 4 starts within one minute." in render_text(report)
