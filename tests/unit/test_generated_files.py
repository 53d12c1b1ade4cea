"""Every generated file is what its generator makes now (scripts/regen.py's list, each generator's own
`--check`), so the fast loop fails on a rules file, dashboard, manifest or docs table left stale."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
from paths import REPO

_spec = importlib.util.spec_from_file_location("regen", REPO / "scripts" / "regen.py")
assert _spec is not None and _spec.loader is not None
regen = importlib.util.module_from_spec(_spec)
sys.modules["regen"] = regen
_spec.loader.exec_module(regen)


@pytest.mark.parametrize("generator", regen.GENERATORS, ids=lambda g: g.script)
def test_the_generated_file_is_current(generator: Any) -> None:
    code, output = regen.run(generator, check=True)
    assert code == 0, f"run: make regen\n{output}"


def test_a_stale_file_fails_its_check(tmp_path: Path) -> None:
    """The checks can fail: the rules rendered to a file that an edit made stale."""
    stale = tmp_path / "rules.yml"
    rules = (REPO / "alerts" / "llamacpp-rules.yml").read_text(encoding="utf-8")
    stale.write_text(rules.replace("0.9", "0.8", 1), encoding="utf-8")
    rules_generator = next(g for g in regen.GENERATORS if g.script == "alerts/generate_rules.py")
    check = regen.Generator(rules_generator.makes, rules_generator.script, (), ("--check", "-o", str(stale)))
    assert regen.run(check, check=True)[0] == 1
    stale.write_text(rules, encoding="utf-8")
    assert regen.run(check, check=True)[0] == 0
