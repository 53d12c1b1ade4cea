"""Shared fixtures: the real llama-server, promtool and Chromium binaries, a selenium Chrome, tiny GGUF models.

A missing binary skips the tests that need it on a developer machine, but fails them under CI
(env ``CI`` set), where scripts/test.sh has just fetched them: a skip there would hide a
broken install behind a green run.

Tests marked ``system`` need systemd's own programs (a private systemd-journald, journalctl,
systemd-analyze) and root; ``make test`` leaves them out and ``make test-system`` runs them.

The folders say what a test needs (docs/testing.md): ``unit/`` runs in process, and a test there that
starts a program fails, naming it (it belongs in ``real_server/``; running a path that does not exist
is allowed, as it starts nothing); ``system/`` holds exactly the tests marked ``system``; ``support/``
holds the helpers, importable by plain name.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

# Make the helper modules in support/ importable as plain modules (`import llama_harness`), whatever
# folder a test is in and whatever rootdir/import mode pytest runs with.
sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))

from llama_harness import find_llama_server
from paths import TOOLS_BIN
from tiny_gguf import write_tiny_gemma2, write_tiny_jamba, write_tiny_llama, write_tiny_mamba

if TYPE_CHECKING:
    from selenium.webdriver import Chrome

# The test tools first on PATH, so a host's own (other) versions do not change what the tests check.
if TOOLS_BIN.is_dir():
    os.environ["PATH"] = f"{TOOLS_BIN}{os.pathsep}{os.environ.get('PATH', '')}"


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _missing(what: str, hint: str) -> NoReturn:
    """Fail under CI, skip elsewhere; never returns."""
    if _in_ci():
        pytest.fail(f"{what} not found under CI: {hint}", pytrace=False)
    pytest.skip(f"{what} not found: {hint}")


@pytest.fixture(scope="session")
def llama_server_bin() -> Path:
    """Path of the real llama-server (b11434); see ``llama_harness.find_llama_server``."""
    found = find_llama_server()
    if found is None:
        _missing(
            "llama-server",
            "run scripts/install-llama-server.sh (≈5 min build) or set LLAMA_SERVER_BIN",
        )
    return found


@pytest.fixture(scope="session")
def promtool_bin() -> Path:
    """Path of promtool: ``$PROMTOOL_BIN``, then ``$PATH``."""
    found = shutil.which(os.environ.get("PROMTOOL_BIN") or "promtool")  # which() also checks +x
    if not found:
        _missing("promtool", "run scripts/unpack-test-tools.sh or set PROMTOOL_BIN")
    return Path(found)


@pytest.fixture(scope="session")
def chromium_bin() -> Path:
    """A headless-capable Chromium: ``$CHROMIUM_BIN``, then ``$PATH`` (the tools folder's first)."""
    found = shutil.which(os.environ.get("CHROMIUM_BIN") or "chromium")
    if not found:
        _missing("chromium", "run scripts/unpack-test-tools.sh or set CHROMIUM_BIN")
    return Path(found)


@pytest.fixture(scope="session")
def chromedriver_bin() -> Path:
    """Chromium's driver, of the same version: ``$CHROMEDRIVER_BIN``, then ``$PATH`` (the tools folder's first)."""
    found = shutil.which(os.environ.get("CHROMEDRIVER_BIN") or "chromedriver")
    if not found:
        _missing("chromedriver", "run scripts/unpack-test-tools.sh or set CHROMEDRIVER_BIN")
    return Path(found)


@pytest.fixture
def chrome(chromium_bin: Path, chromedriver_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chrome]:
    """A headless Chrome driven by selenium on ``chromium_bin`` through ``chromedriver_bin`` (tests/support/browser.py)."""
    try:
        from browser import start_chrome
    except ImportError:
        _missing("selenium", "run scripts/bootstrap.sh --python-only (the test extra)")
    home = tmp_path_factory.mktemp("chrome")
    driver = start_chrome(chromium_bin, chromedriver_bin, home / "profile", home / "chromedriver.log")
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="session")
def tiny_llama_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ~0.5 MB random-weight llama GGUF (n_ctx_train 131072)."""
    return write_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama.gguf")


@pytest.fixture(scope="session")
def tiny_gemma2_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ~0.4 MB random-weight gemma2 GGUF with a 32-token sliding window (checkpoint lines)."""
    return write_tiny_gemma2(tmp_path_factory.mktemp("models") / "tiny-gemma2.gguf")


@pytest.fixture(scope="session")
def tiny_mamba_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ~0.5 MB random-weight Mamba GGUF: a recurrent model (`llama_memory_recurrent`, no KV cache)."""
    return write_tiny_mamba(tmp_path_factory.mktemp("models") / "tiny-mamba.gguf")


@pytest.fixture(scope="session")
def tiny_jamba_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ~0.5 MB random-weight Jamba GGUF: a hybrid model (a Mamba layer and an attention layer)."""
    return write_tiny_jamba(tmp_path_factory.mktemp("models") / "tiny-jamba.gguf")


# ------------------------------------------------------------------------------------------- the layout

TESTS = Path(__file__).resolve().parent
KINDS = ("unit", "real_server", "system")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test file outside the kind folders, or a ``system`` test outside ``system/`` (or the reverse), fails."""
    kind = item.path.relative_to(TESTS).parts[0] if item.path.is_relative_to(TESTS) else None
    if kind not in KINDS:
        pytest.fail(
            f"{item.path.name}: put it in tests/unit, tests/real_server or tests/system (docs/testing.md)", False
        )
    if (kind == "system") != (item.get_closest_marker("system") is not None):
        pytest.fail("tests/system holds exactly the tests marked system (root and systemd)", False)


def _runnable(program: str, env: Any) -> bool:
    if os.sep in program:
        return os.access(program, os.X_OK)
    path = (env if env is not None else os.environ).get("PATH", os.defpath)
    return shutil.which(program, path=path) is not None


def _refuse(what: str) -> NoReturn:
    pytest.fail(f"a unit test starts no program, and this one starts {what}: move it to tests/real_server", False)


@pytest.fixture(autouse=True)
def no_program_starts_in_unit_tests(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """In tests/unit, every way the standard library starts a program fails the test (subprocess, asyncio's
    subprocesses, os.system)."""
    if not request.node.path.is_relative_to(TESTS / "unit"):
        return
    execute_child = subprocess.Popen._execute_child  # type: ignore[attr-defined]

    def guarded(self: subprocess.Popen[Any], args: Any, executable: Any, *rest: Any, **kw: Any) -> Any:
        # The positional order of Popen._execute_child: preexec_fn, close_fds, pass_fds, cwd, env, …, shell.
        env, shell = rest[4], rest[7]
        argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
        program = "/bin/sh" if shell else os.fsdecode(executable if executable is not None else argv[0])
        if _runnable(program, env):
            _refuse(" ".join(os.fsdecode(a) for a in argv)[:200])
        return execute_child(self, args, executable, *rest, **kw)

    def system(command: str) -> NoReturn:
        _refuse(command)

    monkeypatch.setattr(subprocess.Popen, "_execute_child", guarded)
    monkeypatch.setattr(os, "system", system)
