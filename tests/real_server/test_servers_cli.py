"""The exporter's --servers-file errors as the running program prints them (one line naming the entry)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from paths import REPO


def test_servers_file_flag_errors_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "servers.yml"
    bad.write_text("servers:\n  - name: a\n    log_file: x\n    url: ftp://h\n")
    for args, message in (
        (["--servers-file", str(bad)], "--servers-file " + str(bad) + ": server 'a': url: expected an http(s) URL"),
        (["--servers-file", str(tmp_path / "none.yml")], "cannot read"),
        (["--servers-file", str(bad), "--log-file", "x"], "leave out --log-file"),
        (["--servers-file", str(bad), "--demo"], "leave out --demo"),
        (["--servers-file", str(bad), "--server-url", "http://h:1"], "leave out --server-url"),
    ):
        result = _cli(*args)
        assert result.returncode == 2, result
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert message in result.stderr, result.stderr


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "exporter", *args],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
    )
