"""Flags of the live sources: defaults, environment, API key sources, one-line errors naming the flag."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from paths import REPO

from exporter.config import parse_config

LIVE_FLAGS = (
    "--nvml",
    "--proc",
    "--proc-root",
    "--pid",
    "--pid-file",
    "--http",
    "--server-timeout",
    "--api-key",
    "--api-key-file",
    "--kv-pool-capacity",
)


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMACPP_EXPORTER_", "LLAMA_API_KEY"))}
    return subprocess.run(
        [sys.executable, "-m", "exporter", *args],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
        env={**clean, **(env or {})},
        stdin=subprocess.DEVNULL,
    )


def test_defaults() -> None:
    cfg = parse_config(["--log-file", "x.log"], {})
    assert (cfg.host.nvml, cfg.host.proc, cfg.http.enabled, cfg.host.pid, cfg.host.pid_file, cfg.host.proc_root) == (
        True,
        True,
        True,
        None,
        None,
        "/proc",
    )
    assert (cfg.http.server_timeout, cfg.http.api_key, cfg.host.kv_pool_capacity) == (2.0, None, None)


def test_flags_and_environment(tmp_path: Path) -> None:
    env = {
        "LLAMACPP_EXPORTER_NVML": "off",
        "LLAMACPP_EXPORTER_HTTP": "off",
        "LLAMACPP_EXPORTER_PROC_ROOT": str(tmp_path),
        "LLAMACPP_EXPORTER_PID": "42",
        "LLAMACPP_EXPORTER_SERVER_TIMEOUT": "0.5",
        "LLAMACPP_EXPORTER_KV_POOL_CAPACITY": "131072",
    }
    cfg = parse_config(["--log-file", "x.log"], env)
    assert (cfg.host.nvml, cfg.http.enabled, cfg.host.proc_root, cfg.host.pid) == (False, False, str(tmp_path), 42)
    assert (cfg.http.server_timeout, cfg.host.kv_pool_capacity) == (0.5, 131072)
    cfg = parse_config(["--log-file", "x.log", "--nvml", "on", "--server-timeout", "3"], env)
    assert (cfg.host.nvml, cfg.http.server_timeout) == (True, 3.0)  # flags win


def test_api_key_sources_in_order(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("# comment\n\n  from-file  \nsecond\n")
    base = ["--log-file", "x.log"]
    assert parse_config([*base, "--api-key", "from-flag"], {"LLAMA_API_KEY": "x"}).http.api_key == "from-flag"
    assert parse_config([*base, "--api-key-file", str(key_file)], {}).http.api_key == "from-file"
    assert (
        parse_config(base, {"LLAMACPP_EXPORTER_API_KEY": "from-env", "LLAMA_API_KEY": "x"}).http.api_key == "from-env"
    )
    assert parse_config(base, {"LLAMACPP_EXPORTER_API_KEY_FILE": str(key_file)}).http.api_key == "from-file"
    # llama-server's own variable, a comma-separated list: the first key.
    assert parse_config(base, {"LLAMA_API_KEY": "k1,k2"}).http.api_key == "k1"
    cfg = parse_config([*base, "--api-key", "s3cret"], {})
    assert "s3cret" not in repr(cfg)


@pytest.mark.parametrize(
    ("args", "env", "names"),
    [
        (["--nvml", "maybe"], {}, "--nvml"),
        (["--server-timeout", "0"], {}, "--server-timeout"),
        (["--server-timeout", "60"], {}, "--server-timeout"),
        (["--pid", "-3"], {}, "--pid"),
        (["--pid", "1", "--pid-file", "p"], {}, "--pid-file"),
        (["--proc-root", "/no/such/dir"], {}, "--proc-root"),
        (["--kv-pool-capacity", "lots"], {}, "--kv-pool-capacity"),
        (["--api-key", "a", "--api-key-file", "f"], {}, "--api-key-file"),
        (["--api-key-file", "/no/such/key"], {}, "--api-key-file"),
        ([], {"LLAMACPP_EXPORTER_API_KEY_FILE": "/no/such/key"}, "LLAMACPP_EXPORTER_API_KEY_FILE"),
        ([], {"LLAMACPP_EXPORTER_SERVER_TIMEOUT": "soon"}, "--server-timeout"),
    ],
)
def test_bad_values_are_one_line_naming_the_flag(args: list[str], env: dict[str, str], names: str) -> None:
    result = _run("--log-file", "x.log", *args, env=env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and names in lines[0] and "Traceback" not in result.stderr, result.stderr


def test_empty_key_file_is_an_error(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("# only a comment\n")
    result = _run("--log-file", "x.log", "--api-key-file", str(key_file))
    assert result.returncode == 2 and "no key in" in result.stderr


def test_help_lists_every_live_flag_with_its_environment_variable() -> None:
    result = _run("--help")
    assert result.returncode == 0
    for flag in LIVE_FLAGS:
        assert flag in result.stdout
        assert "LLAMACPP_EXPORTER_" + flag.lstrip("-").upper().replace("-", "_") in result.stdout, flag
    assert "LLAMA_API_KEY" in result.stdout
