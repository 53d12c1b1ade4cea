"""`--help` as an operator reads it: groups in the order the data flows, `diagnose` in the usage, every
flag with its environment variable, and the defaults in effect (the environment's, where it sets one)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from paths import REPO

from exporter.config import parse_config
from exporter.flags import build_parser, env_name
from exporter.install_hint import extra_install_hint, hint_for

GROUPS = ["log source", "llama-server HTTP", "host sources", "web and security", "several servers", "guard", "output"]
WHERE = {
    "--log-file": "log source",
    "--journal-unit": "log source",
    "--demo": "log source",
    "--server-url": "llama-server HTTP",
    "--api-key-file": "llama-server HTTP",
    "--server-timeout": "llama-server HTTP",
    "--nvml": "host sources",
    "--pid-file": "host sources",
    "--listen-address": "web and security",
    "--web.config.file": "web and security",
    "--servers-file": "several servers",
    "--guard.listen-address": "guard",
    "--log-level": "output",
}


def _help(**env: str) -> str:
    """`llamacpp-exporter --help` in a clean environment plus `env`, unwrapped (one line per flag)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMACPP_EXPORTER_", "LLAMA_API_KEY"))}
    out = subprocess.run(
        [sys.executable, "-m", "exporter", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
        env={**clean, "COLUMNS": "1000", **env},
        check=True,
    )
    return out.stdout


def _sections(text: str) -> dict[str, dict[str, str]]:
    """Each argument group's flags and their help text, in the order shown."""
    sections: dict[str, dict[str, str]] = {}
    flags: dict[str, str] = {}
    flag = ""
    for line in text.splitlines():
        if re.fullmatch(r"\S[^:]*:", line):
            flags = sections.setdefault(line[:-1], {})
            flag = ""
        elif m := re.match(r"  (?:-\w, )?(--[\w.-]+)", line):
            flag = m.group(1)
            flags[flag] = line
        elif flag and line.startswith("    "):
            flags[flag] += " " + line.strip()
    return sections


def test_groups_follow_the_data_and_hold_every_flag() -> None:
    text = _help()
    usage = text[: text.index("\n\n")]
    assert usage.startswith("usage: llamacpp-exporter ") and "llamacpp-exporter diagnose " in usage, usage
    sections = _sections(text)
    assert [name for name in sections if name != "usage"] == GROUPS, list(sections)
    shown = {flag: group for group, flags in sections.items() for flag in flags}
    for flag, group in WHERE.items():
        assert shown.get(flag) == group, (flag, shown.get(flag))
    every = {s for a in build_parser({})._actions for s in a.option_strings if s.startswith("--")}
    assert set(shown) == every  # no flag left in argparse's catch-all "options"
    for flag in every - {"--help", "--version"}:
        help_text = next(h for flags in sections.values() for f, h in flags.items() if f == flag)
        assert help_text.endswith(f"[{env_name(flag)}]"), help_text


def test_the_environment_changes_the_default_shown_and_in_effect() -> None:
    plain = _sections(_help())
    assert "(default: 0.0.0.0:9778)" in plain["web and security"]["--listen-address"]
    assert "(default: info)" in plain["output"]["--log-level"]
    env = {
        "LLAMACPP_EXPORTER_LISTEN_ADDRESS": "127.0.0.1:9999",
        "LLAMACPP_EXPORTER_LOG_LEVEL": "debug",
        "LLAMACPP_EXPORTER_SERVER_URL": "http://10.0.0.5:8081",
        "LLAMACPP_EXPORTER_API_KEY": "s3cret-key",
    }
    text = _help(**env)
    sections = _sections(text)
    assert (
        "(default: 127.0.0.1:9999, from LLAMACPP_EXPORTER_LISTEN_ADDRESS)"
        in (sections["web and security"]["--listen-address"])
    )
    assert "0.0.0.0:9778)" not in text
    assert "(default: debug, from LLAMACPP_EXPORTER_LOG_LEVEL)" in sections["output"]["--log-level"]
    assert "(default: http://10.0.0.5:8081, from" in sections["llama-server HTTP"]["--server-url"]
    # A key is never printed, only where it comes from.
    assert "s3cret-key" not in text
    assert "(default: set by LLAMACPP_EXPORTER_API_KEY)" in sections["llama-server HTTP"]["--api-key"]
    # What the help shows is what runs.
    config = parse_config(["--demo"], env)
    assert (config.web.host, config.web.port, config.output.log_level) == ("127.0.0.1", 9999, "debug")
    assert config.http.server_url == "http://10.0.0.5:8081"


def test_a_flag_wins_over_the_environment_default_shown() -> None:
    env = {"LLAMACPP_EXPORTER_LISTEN_ADDRESS": "127.0.0.1:9999"}
    assert parse_config(["--demo", "--listen-address", "127.0.0.1:7000"], env).web.port == 7000


@pytest.mark.parametrize(
    ("direct_url", "expected"),
    [
        # PEP 610's forms, as pip writes them into direct_url.json.
        (
            {"url": "file:///home/me/llamacpp-exporter", "dir_info": {"editable": True}},
            "-e '/home/me/llamacpp-exporter[html]'",
        ),
        ({"url": "file:///srv/llama%20tools/exporter", "dir_info": {}}, "'/srv/llama tools/exporter[html]'"),
        (
            {"url": "file:///tmp/llamacpp_exporter-0.1.0-py3-none-any.whl", "archive_info": {}},
            "'llamacpp-exporter[html] @ file:///tmp/llamacpp_exporter-0.1.0-py3-none-any.whl'",
        ),
        (
            {"url": "https://git.example/llamacpp-exporter", "vcs_info": {"vcs": "git", "commit_id": "abc123"}},
            "'llamacpp-exporter[html] @ git+https://git.example/llamacpp-exporter@abc123'",
        ),
        (None, "'llamacpp-exporter[html]'"),  # from a package index
    ],
)
def test_install_hint_reaches_where_the_package_came_from(direct_url: dict[str, object] | None, expected: str) -> None:
    hint = hint_for("html", direct_url)
    assert hint.endswith(f" -m pip install {expected}"), hint
    assert hint.startswith(sys.executable)


def test_install_hint_from_a_source_tree_and_for_this_checkout() -> None:
    assert hint_for("html", None, installed=False) == "pip install '.[html]' in a clone of this repository"
    # The tests run in the .venv scripts/bootstrap.sh made: this checkout installed with -e.
    assert extra_install_hint("html").endswith(f" -m pip install -e '{REPO}[html]'")


def test_readme_flags_table_has_every_flag_in_helps_groups() -> None:
    """The README's table holds every flag with its variable, under the same groups in the same order."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    table = readme[readme.index("## Flags\n") :]
    table = table[: table.index("\n\n", table.index("| flag |"))]
    assert re.findall(r"^\| \*\*(.+?)\*\* \|", table, re.M) == GROUPS
    for flag in {s for a in build_parser({})._actions for s in a.option_strings if s.startswith("--")} - {
        "--help",
        "--version",
    }:
        assert re.search(rf"`{re.escape(flag)}(?: [^`]*)?` \[`{env_name(flag)}`\]", table), flag
