"""`diagnose`'s exit statuses mean one thing each, and what it says of each input is true of it.

0 no failure, 1 a failure, 2 the command line, 3 an input that cannot be diagnosed, 4 the report that cannot be
made or written: each produced here by its cause, and --help and docs/diagnose.md say the same words (from
`exporter.diagnose.cli.EXIT_CODES`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from paths import B11434, FIXTURES, REPO

from exporter.diagnose import cli
from exporter.diagnose.cli import EXIT_CODES, EXIT_STATUS, main

LOG = str(B11434 / "exhaust-lv4" / "llama-server.log")  # one failure
CLEAN = str(B11434 / "recover-purge-lv4" / "llama-server.log")


def _garbage(tmp_path: Path) -> str:
    path = tmp_path / "garbage.bin"
    path.write_bytes(bytes(range(256)) * 16)
    return str(path)


def test_each_status_has_its_cause(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert main([CLEAN]) == 0
    assert main([LOG]) == 1
    with pytest.raises(SystemExit) as usage:
        main(["--max-runs", "x", LOG])
    assert usage.value.code == 2
    assert main([_garbage(tmp_path)]) == 3
    assert main([str(FIXTURES / "foreign" / "sshd-auth.log")]) == 3
    assert main([str(tmp_path / "missing.log")]) == 3
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # the html extra not installed
    assert main([LOG, "--html", str(tmp_path / "page.html")]) == 4
    monkeypatch.undo()
    assert main([LOG, "--html", str(tmp_path)]) == 4  # a folder
    assert sorted(EXIT_CODES) == [0, 1, 2, 3, 4]


def test_help_and_the_docs_say_the_codes_table(capsys: pytest.CaptureFixture[str]) -> None:
    epilog = cli.build_parser().epilog or ""
    assert EXIT_STATUS in epilog
    docs = " ".join((REPO / "docs" / "diagnose.md").read_text(encoding="utf-8").split())
    assert EXIT_STATUS in docs, EXIT_STATUS


def test_a_skipped_input_is_not_named_a_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`diagnose LOG garbage.bin` (either order): the header names the log read, the garbage as not read."""
    garbage = _garbage(tmp_path)
    for args in ([LOG, garbage], [garbage, LOG]):
        assert main(args) == 1
        out = capsys.readouterr().out.splitlines()
        assert out[0] == f"llama-server log: {LOG}", out[:2]
        assert out[1].startswith(f"Not read: {garbage}: binary data, not a text log"), out[:2]
        assert garbage not in out[0]
