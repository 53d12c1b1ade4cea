"""Every docstring example under exporter/ runs and shows what it claims (doctest), so none can go stale.

Shell sessions and sample /metrics output in docstrings are prose, not doctests; the one that claims
diagnose's output is held to the real output here.
"""

from __future__ import annotations

import doctest
import importlib
import io
import pkgutil
import re
from contextlib import redirect_stdout
from pathlib import Path

import pytest
from paths import B11434

import exporter
from exporter.diagnose.cli import main as diagnose_main

MODULES = sorted(
    info.name for info in pkgutil.walk_packages(exporter.__path__, "exporter.") if not info.name.endswith("__main__")
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    module = importlib.import_module(name)
    results = doctest.testmod(module, report=False)
    assert results.failed == 0, f"{name}: {results.failed} of {results.attempted} examples fail (output above)"


@pytest.mark.parametrize("name", MODULES)
def test_every_example_is_one_doctest_finds(name: str) -> None:
    """A `>>>` line where doctest does not look (a comment, a string that is not a docstring) would never run."""
    module = importlib.import_module(name)
    assert module.__file__ is not None
    written = sum(line.lstrip().startswith(">>> ") for line in Path(module.__file__).read_text().splitlines())
    found = sum(len(test.examples) for test in doctest.DocTestFinder().find(module))
    assert found == written, f"{name}: {written} `>>>` lines, {found} examples found by doctest"


def test_the_shell_session_in_diagnoses_docstring_is_its_output() -> None:
    """exporter/diagnose/__init__.py shows diagnose on tests/fixtures/b11434/exhaust-lv4: every line it
    shows (`...` elides) is in the real output, in order, with the same indentation."""
    doc = importlib.import_module("exporter.diagnose").__doc__
    assert doc is not None
    block = doc.split("    $ llamacpp-exporter diagnose llama-server.log\n", 1)[1].split("\n\n", 1)[0]
    shown = [line[4:] for line in block.splitlines() if line.strip() != "..."]
    out = io.StringIO()
    with redirect_stdout(out):
        diagnose_main([str(B11434 / "exhaust-lv4" / "llama-server.log")])
    real = out.getvalue().splitlines()
    at = 0
    for line in shown:
        pattern = re.escape(line)
        at = next((i + 1 for i in range(at, len(real)) if re.fullmatch(pattern, real[i])), -1)
        assert at > 0, f"not in diagnose's output (in this order): {line!r}"
