"""What Windows and macOS get from the repository without running here: the portability workflow checked
by `check-jsonschema --builtin-schema vendor.github-workflows` (the workflow schema it vendors) and read
for what it runs; `.gitattributes` asked through `git check-attr`, so that Git for Windows checks the
fixture logs and the demo's logs out byte for byte (no CRLF), and nothing committed changes with it."""

from __future__ import annotations

import re
import subprocess
import sys

import yaml
from paths import REPO

WORKFLOW = REPO / ".github" / "workflows" / "portability.yml"


def test_the_workflow_matches_the_github_workflow_schema() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows", str(WORKFLOW)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_workflow_runs_windows_and_macos_on_every_supported_python() -> None:
    job = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))["jobs"]["test"]
    matrix = job["strategy"]["matrix"]
    assert set(matrix["os"]) == {"windows-latest", "macos-latest"}
    requires = re.findall(r'^requires-python = "(.+)"$', (REPO / "pyproject.toml").read_text(encoding="utf-8"), re.M)
    assert requires == [">=3.10"] and matrix["python"] == ["3.10", "3.11", "3.12", "3.13"]
    runs = [s["run"] for s in job["steps"] if "run" in s]
    assert any("pytest" in r and "tests/unit" in r for r in runs)
    (demo,) = [r for r in runs if "demo_counters.py" in r]
    for word in demo.split():
        if word.startswith("tests/"):
            assert (REPO / word).is_file(), word


def test_fixture_and_demo_logs_are_checked_out_byte_for_byte() -> None:
    files = _git("ls-files", "tests/fixtures", "exporter/data").splitlines()
    assert len(files) > 100
    attrs = _git("check-attr", "text", "--", *files).splitlines()
    assert [a for a in attrs if not a.endswith(": text: unset")] == []
    # Nothing committed is changed by the attributes: no file was committed with CRLF line ends.
    assert [line for line in _git("ls-files", "--eol").splitlines() if line.startswith("i/crlf")] == []


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True).stdout
