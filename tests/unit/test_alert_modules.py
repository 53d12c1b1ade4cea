"""The alert modules each hold their alerts' facts: an alert's settings (`Settings`) and its place in the rules
file (`@ALERTS.add`) are written beside it, and `Config` and the rules file are made of them. These tests fail
on a module left out of either, a setting declared twice, or an alert function not registered."""

from __future__ import annotations

import inspect
from dataclasses import fields

from paths import REPO
from prom_harness import load_script

load_script(REPO / "alerts" / "generate_rules.py")  # puts llamacpp_rules on sys.path

from llamacpp_rules import document  # noqa: E402
from llamacpp_rules.builder import Rules  # noqa: E402
from llamacpp_rules.config import Config, Shared  # noqa: E402


def test_config_is_made_of_every_module_s_settings() -> None:
    """`Config`'s bases are the modules' `Settings` in the rules file's order (listed in reverse: a dataclass
    takes its bases' fields last base first), and the shared settings."""
    assert Config.__bases__ == (*(m.Settings for m in reversed(document.MODULES)), Shared)


def test_no_setting_is_declared_twice() -> None:
    """A name in two modules' settings would be one setting to `Config`, silently: the later default wins."""
    declared = [f.name for cls in (Shared, *(m.Settings for m in document.MODULES)) for f in fields(cls)]
    assert len(declared) == len(set(declared)) == len(fields(Config))


def test_list_reads_the_shared_settings_then_each_module_s() -> None:
    """`generate_rules.py --list` follows `Config`'s fields: the shared ones first, then module by module."""
    expected = [f.name for cls in (Shared, *(m.Settings for m in document.MODULES)) for f in fields(cls)]
    assert [f.name for f in fields(Config)] == expected


def test_every_alert_function_is_in_the_rules_file() -> None:
    """Every function of an alert module that builds an alert from `Rules` is registered (`@ALERTS.add`), or
    is the Watchdog the document puts last; nothing is registered twice."""
    registered = list(document.ALERTS)
    assert len(registered) == len(set(registered))
    for module in document.MODULES:
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if fn.__module__ != module.__name__ or name.startswith("_"):
                continue
            if list(inspect.signature(fn).parameters) == ["r"] and inspect.signature(fn).return_annotation == "Rule":
                assert fn in registered, f"{module.__name__}.{name} builds an alert but is not @ALERTS.add"


def test_the_rules_file_holds_the_alerts_in_module_order() -> None:
    names = [alert(Rules(Config()))["alert"] for alert in document.ALERTS]
    rendered = [rule["alert"] for rule in document.build()["groups"][1]["rules"]]
    assert rendered == names
    assert names[0] == "LlamaCppKVPoolRequestsAborted" and names[-1] == "LlamaCppWatchdog"
