"""Each flag's default is written once, in its field of exporter/settings.py: argparse's default, `--help`'s
"(default: …)", the README's flag table and docs/guard.md's are all checked against that field here."""

from __future__ import annotations

import argparse
import re
from dataclasses import fields

import pytest
from paths import REPO

from exporter.config import Config, parse_config
from exporter.flags import build_parser, shown_default
from exporter.settings import AREAS, ClientOptions, GuardArea, LogArea, dest, flag_defaults

DEFAULTS = flag_defaults()
#: Flags read after parsing (exporter/config.py), so without a field of their own: none is their default.
WITHOUT_FIELD = {"--api-key-file", "--servers-file"}


def _flag_actions() -> dict[str, argparse.Action]:
    return {
        s: a
        for a in build_parser({})._actions
        for s in a.option_strings
        if s.startswith("--") and s not in ("--help", "--version")
    }


def test_every_flag_has_a_field_and_every_field_a_flag() -> None:
    actions = _flag_actions()
    assert set(actions) == set(DEFAULTS) | WITHOUT_FIELD
    for flag, action in actions.items():
        assert action.dest == dest(flag), flag  # what config.area_of reads


def test_argparse_takes_each_default_from_its_field() -> None:
    for flag, action in _flag_actions().items():
        assert action.default == DEFAULTS.get(flag), flag


def test_a_config_from_no_flags_is_the_areas_defaults() -> None:
    """Every field is read from its flag (a field whose flag is missing or misnamed fails here)."""
    assert parse_config(["--log-file", "x.log"], {}) == Config(logs=LogArea(file="x.log"))
    assert {f.type for f in fields(Config)} >= {a.__name__ for a in AREAS}


def test_each_field_is_set_by_its_flag() -> None:
    config = parse_config(
        ["--log-file", "x.log", "--guard.queue-timeout", "5", "--guard.head-timeout", "3", "--guard.max-clients", "2"],
        {
            "LLAMACPP_EXPORTER_GUARD_QUEUE_SIZE": "7",
            "LLAMACPP_EXPORTER_GUARD_ADMISSION": "off",
            "LLAMACPP_EXPORTER_GUARD_CONNECT_TIMEOUT": "2.5",
        },
    )
    assert config.guard == GuardArea(max_wait=5, head_timeout=3, max_queue=7, admission=False, connect_timeout=2.5)
    assert config.clients == ClientOptions(max_clients=2)


def test_the_guards_settings_are_its_areas() -> None:
    """GuardSettings has no default of its own for what a flag sets: each comes from the guard's area."""
    from exporter.guard.proxy import GuardSettings

    area = GuardArea(max_wait=5, head_timeout=3, max_queue=7, admission=False, connect_timeout=2.5)
    settings = GuardSettings.of(area, "http://127.0.0.1:8080", "key", quiet=0.5)
    assert (settings.max_wait, settings.body_timeout, settings.max_queue, settings.admission) == (5, 3, 7, False)
    assert settings.connect_timeout == 2.5
    assert (settings.upstream, settings.api_key, settings.quiet) == ("http://127.0.0.1:8080", "key", 0.5)
    assert settings.default_budget == GuardArea().default_budget
    from_flags = {f.name for f in fields(GuardSettings) if f.default is f.default_factory}  # no default: MISSING
    assert from_flags <= {f.name for f in fields(GuardArea)} | {"upstream", "body_timeout"}


def _help_lines(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Each flag's help text in `--help`, unwrapped."""
    monkeypatch.setenv("COLUMNS", "10000")
    lines: dict[str, str] = {}
    flag = ""
    for line in build_parser({}).format_help().splitlines():
        if m := re.match(r"  (?:-\w, )?(--[\w.-]+)", line):
            flag = m[1]
            lines[flag] = line
        elif flag and line.startswith("    "):
            lines[flag] += " " + line.strip()
        else:
            flag = ""
    return lines


def test_help_shows_each_fields_default(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = _help_lines(monkeypatch)
    actions = _flag_actions()
    for flag, default in DEFAULTS.items():
        shown = shown_default(default, actions[flag].metavar)  # type: ignore[arg-type]
        if shown is not None:
            assert f"(default: {shown}) [" in lines[flag], (flag, lines[flag])


def _table_rows(page: str) -> dict[str, str]:
    """The default column of each flag's row in the tables of `page` (`| flag | default | meaning |`)."""
    rows: dict[str, str] = {}
    for line in (REPO / page).read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        if len(cells) >= 3 and cells[0].startswith("`--"):
            for flag in re.findall(r"`(--[\w.-]+)", cells[0]):
                rows[flag] = cells[1]
    return rows


@pytest.mark.parametrize("page", ["README.md", "docs/guard.md"])
def test_the_docs_tables_show_each_fields_default(page: str) -> None:
    rows = _table_rows(page)
    actions = _flag_actions()
    assert rows, page
    if page == "README.md":
        assert set(rows) == set(actions)
    for flag, cell in rows.items():
        shown = shown_default(DEFAULTS.get(flag), actions[flag].metavar)  # type: ignore[arg-type]
        if shown is not None:
            assert cell == f"`{shown}`", (page, flag, cell)
        else:  # no value: words that say what happens (none, found automatically, …), never a literal
            assert not re.fullmatch(r"`[^`]*`", cell), (page, flag, cell)


def test_a_default_named_in_the_docs_prose_is_the_fields() -> None:
    """`--flag X` (default `value`) in a sentence of the README or docs/ says the field's default."""
    actions = _flag_actions()
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    named = [
        (page.name, m[1], m[2])
        for page in pages
        for m in re.finditer(r"`(--[\w.-]+)[^`]*` \(default `([^`]+)`\)", page.read_text(encoding="utf-8"))
    ]
    assert named  # the README's sources table names --server-url's
    for page, flag, value in named:
        assert value == shown_default(DEFAULTS[flag], actions[flag].metavar), (page, flag, value)  # type: ignore[arg-type]


def _refusal(argv: list[str], env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        parse_config(argv, env)
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize(
    ("var", "value", "words"),
    [
        ("LLAMACPP_EXPORTER_LOG_POLL_INTERVAL", "soon", "expected a number of seconds, got 'soon'"),
        ("LLAMACPP_EXPORTER_LOG_LEVEL", "verbose", "invalid choice 'verbose'"),
        ("LLAMACPP_EXPORTER_NVML", "maybe", "expected on or off, got 'maybe'"),
        ("LLAMACPP_EXPORTER_LISTEN_ADDRESS", "nonsense", "expected HOST:PORT"),
        ("LLAMACPP_EXPORTER_PROCESS_SOURCE", "nope", "invalid choice 'nope'"),
        ("LLAMACPP_EXPORTER_GUARD_ADMISSION", "maybe", "expected on or off, got 'maybe'"),
        ("LLAMACPP_EXPORTER_PID_FILE", " ", "empty path"),
    ],
)
def test_a_bad_environment_value_is_named_by_its_variable(
    var: str, value: str, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A unit's or an .env's user is told the variable they set, not a flag they never passed."""
    err = _refusal(["--log-file", "x.log"], {var: value}, capsys)
    assert err.startswith(f"llamacpp-exporter: error: {var} (the environment's ") and words in err, err


def test_a_bad_flag_value_is_named_by_the_flag_even_with_the_variable_set(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--nvml", "maybe"], ["--nvml=maybe"], ["--nv", "maybe"]):
        err = _refusal(["--log-file", "x.log", *argv], {"LLAMACPP_EXPORTER_NVML": "on"}, capsys)
        assert err.startswith("llamacpp-exporter: error: argument --nvml: expected on or off, got 'maybe'"), err


def test_every_on_off_flag_says_on_or_off(capsys: pytest.CaptureFixture[str]) -> None:
    """A flag shown as on|off refuses a bad value in those words; yes/no, true/false and 1/0 still work."""
    on_off = [s for s, a in _flag_actions().items() if a.metavar == "on|off"]
    assert len(on_off) >= 4, on_off
    for flag in on_off:
        err = _refusal(["--log-file", "x.log", flag, "maybe"], {}, capsys)
        assert f"argument {flag}: expected on or off, got 'maybe'" in err, err
