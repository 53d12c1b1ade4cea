"""scripts/llama_server_suite.py: the wrapper that puts the guard in front of llama.cpp's own server tests
(its arguments rewritten for the local model), and the test-by-test comparison of the two runs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from paths import REPO

_spec = importlib.util.spec_from_file_location("llama_server_suite", REPO / "scripts" / "llama_server_suite.py")
assert _spec is not None and _spec.loader is not None
suite = importlib.util.module_from_spec(_spec)
sys.modules["llama_server_suite"] = suite
_spec.loader.exec_module(suite)


def test_model_fetches_become_the_local_model_and_the_rest_is_kept() -> None:
    args = ["--port", "8080", "--hf-repo", "ggml-org/models", "--hf-file", "x.gguf", "--offline", "-c", "512"]
    assert suite._rewrite(args, "/m.gguf") == ["--port", "8080", "-c", "512", "--model", "/m.gguf"]
    assert suite._rewrite(["--model", "/own.gguf", "--offline"], "/m.gguf") == ["--model", "/own.gguf"]
    assert suite._replace(["--port", "8080", "--host", "::1"], "--port", "9") == ["--port", "9", "--host", "::1"]
    assert suite._address("::1", 8080) == "[::1]:8080"


def test_the_comparison_names_each_test_whose_outcome_differs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def report(name: str, cases: str) -> str:
        path = tmp_path / name
        path.write_text(f"<testsuites><testsuite>{cases}</testsuite></testsuites>")
        return str(path)

    same = '<testcase classname="unit.a" name="t1"/><testcase classname="unit.a" name="t2"><failure/></testcase>'
    direct = report("d.xml", same + '<testcase classname="unit.b" name="t3"/>')
    guard = report("g.xml", same + '<testcase classname="unit.b" name="t3"><error/></testcase>')
    assert suite.compare(direct, direct) == 0
    assert suite.compare(direct, guard) == 1
    out = capsys.readouterr().out
    assert "DIFFERS unit.b::t3: direct passed, guard failed" in out
    assert "direct  3 tests: 2 passed, 1 failed, 0 skipped" in out
