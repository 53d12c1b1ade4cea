"""`make demo`'s set-up (scripts/bootstrap.sh --package-only) never asks for root: where Python's venv
module is missing it stops with one line that names the package to install."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from paths import REPO


def test_package_only_without_venv_is_one_line_and_no_sudo(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    (clone / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "bootstrap.sh", clone / "scripts")
    shutil.copy(REPO / "pyproject.toml", clone)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    called = tmp_path / "called"
    # sudo and apt-get that only record that they were called; a Python whose venv module is missing
    # the way Debian's is without python3-venv (ensurepip absent).
    for name in ("sudo", "apt-get"):
        tool = bin_dir / name
        tool.write_text(f'#!/bin/sh\necho {name} "$@" >>{called}\n')
        tool.chmod(0o755)
    python = bin_dir / "python3"
    python.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = -m ] && [ "$2" = venv ]; then\n'
        '  mkdir -p "$3"; echo "The virtual environment was not created successfully because ensurepip is not '
        'available." >&2; exit 1\n'
        "fi\n"
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    out = subprocess.run(
        ["bash", str(clone / "scripts" / "bootstrap.sh"), "--package-only"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHON": str(python)},
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 1, out.stderr
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    *_, last = out.stderr.strip().splitlines()
    assert last.startswith(f"bootstrap: '{python} -m venv' failed: install python{version}-venv"), out.stderr
    assert not called.exists(), called.read_text()
    assert not (clone / ".venv").exists()  # a half-made .venv would be taken for a ready one next time
