"""deploy/systemd/: the two units pass `systemd-analyze verify`, and what they run works.

No systemd runs as pid 1 here, so the units are not started by systemd. Instead, what they would run
is run: llama-server's ExecStart with the unit's Environment= settings (the real llama-server b11434),
attached to a real systemd-journald as unit llama-server.service the way systemd attaches a service
(see source_harness), and the exporter with its unit's ExecStart arguments reading that journal.
How the two units fit together is read in process: tests/unit/test_deploy_systemd_units.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest
from llama_harness import free_port, http_json, run_concurrent_completions, wait_for
from source_harness import PrivateJournald, SourceExporter, find_journald
from systemd_units import EXPORTER_UNIT, SERVER_UNIT, environment, exec_start


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _missing(what: str) -> NoReturn:
    if _in_ci():
        pytest.fail(f"{what} (under CI)", pytrace=False)
    pytest.skip(what)


@pytest.mark.system
def test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    """`systemd-analyze verify` (systemd 252) with no warning at all; the binaries are swapped for an
    executable that exists here, because verify checks that ExecStart= can be executed."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        _missing("systemd-analyze not installed (Debian package systemd)")
    true = shutil.which("true")
    assert true
    for unit in (SERVER_UNIT, EXPORTER_UNIT):
        text = unit.read_text()
        for binary in ("/usr/local/bin/llama-server", "/usr/local/bin/llamacpp-exporter"):
            text = text.replace(binary, true)
        (tmp_path / unit.name).write_text(text)
    result = subprocess.run(
        [analyze, "verify", "--man=no", *(str(tmp_path / u.name) for u in (SERVER_UNIT, EXPORTER_UNIT))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), (
        result.stdout + result.stderr
    )


@pytest.fixture
def journald(tmp_path: Path) -> Iterator[PrivateJournald]:
    binary = find_journald()
    if binary is None or shutil.which("journalctl") is None:
        _missing("systemd-journald/journalctl not installed (Debian package systemd)")
    if os.geteuid() != 0:
        _missing("starting a private systemd-journald needs root")
    with PrivateJournald(binary, tmp_path) as j:
        yield j


@pytest.mark.system
@pytest.mark.llama_server
def test_what_the_units_run_works_together(
    journald: PrivateJournald, llama_server_bin: Path, tiny_llama_model: Path, tmp_path: Path
) -> None:
    """llama-server.service's command and environment under journald as llama-server.service, and
    llamacpp-exporter.service's arguments reading that journal: the seed incident is exported."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_")}
    env.update(environment(SERVER_UNIT))
    assert env["LLAMA_ARG_MODEL"].endswith(".gguf")
    env.update(
        LLAMA_ARG_MODEL=str(tiny_llama_model),
        LLAMA_ARG_N_GPU_LAYERS="0",  # no GPU here
        LLAMA_ARG_CTX_SIZE="512",  # the seed incident: 4 slots sharing 512 cells
        LLAMA_ARG_KV_UNIFIED="1",
        LLAMA_ARG_THREADS="2",
        OMP_WAIT_POLICY="passive",
    )
    server_argv = exec_start(SERVER_UNIT)
    port = str(free_port())
    server_argv[server_argv.index("--port") + 1] = port
    server_argv[0] = str(llama_server_bin)
    exporter_args = exec_start(EXPORTER_UNIT)[1:]
    exporter_args[exporter_args.index("--server-url") + 1] = f"http://127.0.0.1:{port}"
    listen = exporter_args.index("--listen-address")
    del exporter_args[listen : listen + 2]  # the harness picks a free port
    exporter_args += ["--journal-namespace", journald.namespace]
    unit = SERVER_UNIT.name
    procs: list[subprocess.Popen[bytes]] = []
    try:
        # The exporter first (as after a boot, where both units start together): the server's start is live.
        with SourceExporter(exporter_args, workdir=tmp_path, name="unit") as exporter:
            procs.append(
                subprocess.Popen(
                    journald.stream_command(unit, server_argv),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    env=env,
                )
            )
            proc = procs[0]

            def healthy() -> bool:
                if proc.poll() is not None:
                    raise RuntimeError(f"llama-server exited rc={proc.returncode}:\n{journald.journalctl('-u', unit)}")
                try:
                    return http_json(f"http://127.0.0.1:{port}/health", timeout=2)[0] == 200
                except OSError:
                    return False

            wait_for(healthy, timeout=60, what="llama-server /health 200")
            results = run_concurrent_completions(f"http://127.0.0.1:{port}", n=4)
            assert [status for status, _ in results] == [500] * 4, results
            wait_for(
                lambda: exporter.sample("llamacpp_requests_aborted_total", {"reason": "context_exceeded"}) == 4,
                timeout=30,
                what="4 aborted requests exported from the journal",
            )
            assert exporter.sample("llamacpp_kv_pool_capacity_tokens") == 512
            assert exporter.sample("llamacpp_slots") == 4
            assert exporter.sample("llamacpp_server_starts_total") == 1
            assert exporter.sample("llamacpp_exporter_source_up", {"source": "log"}) == 1
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(30)
