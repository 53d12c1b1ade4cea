"""The Windows and macOS service recipes in deploy/windows and deploy/macos, read as text: the exporter's
arguments in each parse with the exporter's own flags (a renamed flag fails here), follow a wrapper's
stderr file, and the service settings that keep it running are there. The plist is read by plistlib."""

from __future__ import annotations

import plistlib
import re
from pathlib import Path

import pytest
from paths import REPO

from exporter.config import Config, parse_config
from exporter.flags import build_parser

WINDOWS = REPO / "deploy" / "windows"
PLIST = REPO / "deploy" / "macos" / "local.llamacpp-exporter.plist"
SCRIPTS = ("register-scheduled-task.ps1", "install-nssm-service.ps1")


def _powershell_args(script: Path) -> tuple[list[str], dict[str, str]]:
    """`$ExporterArgs = @(...)` of a script, its `$Variables` replaced by the param() block's defaults."""
    text = script.read_text(encoding="utf-8")
    defaults = dict(re.findall(r'\[string\]\$(\w+) = "([^"]*)"', text))
    block = re.search(r"\$ExporterArgs = @\((.*?)\n\)", text, re.S)
    assert block is not None, f"{script.name}: no $ExporterArgs = @( ... ) block"
    args = []
    for quoted, variable in re.findall(r'"([^"]*)"|\$(\w+)', block.group(1)):
        args.append(defaults[variable] if variable else quoted)
    return args, defaults


def _parse(args: list[str]) -> Config:
    """The exporter's own parsing of `args`, each flag spelled in full (argparse would take a prefix)."""
    known = {s for a in build_parser({})._actions for s in a.option_strings}
    assert [a for a in args if a.startswith("--") and a not in known] == []
    return parse_config(args, {})


def _check(config: Config, log_file: str) -> None:
    assert config.logs.file == log_file and config.logs.source == "file"
    assert config.http.server_url == "http://127.0.0.1:8080"
    assert (config.web.host, config.web.port) == ("127.0.0.1", 9778)
    assert config.host.process_source == "auto"  # psutil there: Windows and macOS have no /proc


@pytest.mark.parametrize("name", SCRIPTS)
def test_windows_recipes_pass_flags_the_exporter_parses(name: str) -> None:
    args, defaults = _powershell_args(WINDOWS / name)
    assert defaults["LogFile"] == r"C:\llama\logs\llama-server.stderr"  # the wrapper's file, not a .prev copy
    _check(_parse(args), defaults["LogFile"])
    assert defaults["Exe"].endswith(r"\Scripts\llamacpp-exporter.exe")


def test_both_windows_recipes_run_the_same_exporter() -> None:
    (a, da), (b, db) = (_powershell_args(WINDOWS / n) for n in SCRIPTS)
    assert a == b and {k: da[k] for k in ("Exe", "LogFile")} == {k: db[k] for k in ("Exe", "LogFile")}


def test_the_scheduled_task_starts_at_boot_and_again_after_an_exit() -> None:
    text = (WINDOWS / "register-scheduled-task.ps1").read_text(encoding="utf-8")
    for needed in (
        "New-ScheduledTaskTrigger -AtStartup",
        "-RepetitionInterval (New-TimeSpan -Minutes 1)",  # starts it again after an exit
        "-MultipleInstances IgnoreNew",  # never a second exporter on the same port
        "-ExecutionTimeLimit ([TimeSpan]::Zero)",  # not stopped after the default 72 hours
        "-RestartCount 255",  # Task Scheduler's limit (1 to 255)
        "Register-ScheduledTask",
    ):
        assert needed in text, needed


def test_the_nssm_service_restarts_and_stops_with_ctrl_c() -> None:
    text = (WINDOWS / "install-nssm-service.ps1").read_text(encoding="utf-8")
    settings = dict(re.findall(r"^nssm set \$ServiceName (\w+) (.+)$", text, re.M))
    assert settings["AppExit"] == "Default Restart" and int(settings["AppRestartDelay"]) > 0
    assert settings["Start"] == "SERVICE_AUTO_START"
    assert int(settings["AppStopMethodConsole"]) > 0  # Ctrl-C first: the exporter's clean exit
    assert settings["AppParameters"] == "$Parameters"


def test_the_launchd_plist_keeps_the_exporter_alive() -> None:
    with PLIST.open("rb") as f:
        plist = plistlib.load(f)
    assert plist["Label"] == PLIST.stem
    assert plist["KeepAlive"] is True and plist["RunAtLoad"] is True
    assert plist["StandardErrorPath"].startswith("/") and plist["StandardOutPath"].startswith("/")
    argv = plist["ProgramArguments"]
    assert Path(argv[0]).name == "llamacpp-exporter"
    _check(_parse(argv[1:]), "/usr/local/var/log/llama-server.stderr")
