"""Live sources against a REAL llama-server (b11434) and the exporter as a real process.

Acceptance of issue #3: /proc figures against `ps` and `free`; pool capacity from the command line
against the server's own log, at -lv 4 and at the default verbosity; per-slot tokens against `/slots`
during four long generations; `llamacpp_up` and `llamacpp_server_loading`; an API key; a scrape with
every source failing. Figures are printed (pytest -s shows them) for the issue note.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from llama_harness import (
    ExporterProcess,
    LlamaServer,
    free_port,
    http_json,
    http_request,
    run_concurrent_completions,
    wait_for,
)
from paths import B11434, REPO
from prometheus_client.parser import text_string_to_metric_families
from tiny_gguf import SLOW_LOAD_SERVER_ARGS, write_slow_loading_model

from exporter.sources.procfs import ProcReader

pytestmark = pytest.mark.llama_server

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _samples(text: str) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): float(s.value)
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def _get(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def _info(samples: Samples, name: str) -> dict[str, str]:
    (labels,) = [dict(k[1]) for k in samples if k[0] == name]
    return labels


def _exporter(srv: LlamaServer, *extra: str, env: dict[str, str] | None = None) -> ExporterProcess:
    return ExporterProcess(srv.log_file, ["--server-url", srv.url, *extra], env=env)


def _ps_rss_bytes(pid: int) -> int:
    out = subprocess.run(["ps", "-o", "rss=", "-p", str(pid)], capture_output=True, text=True, check=True, timeout=10)
    return int(out.stdout.strip()) * 1024


def _free_available_bytes() -> int:
    out = subprocess.run(["free", "-b"], capture_output=True, text=True, check=True, timeout=10).stdout
    mem = next(line for line in out.splitlines() if line.startswith("Mem:")).split()
    return int(mem[6])  # total used free shared buff/cache available


# ---------------------------------------------------------------- acceptance 2: /proc against ps, free, the log


def test_process_memory_matches_ps_and_host_memory_matches_free(
    llama_server_bin: Path, tiny_llama_model: Path, tmp_path: Path
) -> None:
    args = ["-c", "512", "-np", "4", "-kvu", "-t", "2"]
    with (
        LlamaServer(llama_server_bin, tiny_llama_model, args, log_file=tmp_path / "ls.log") as srv,
        _exporter(srv) as exporter,
    ):
        s = _samples(exporter.scrape())
        ps_rss, free_avail = _ps_rss_bytes(srv.pid), _free_available_bytes()
        rss = _get(s, "llamacpp_process_resident_memory_bytes")
        avail = _get(s, "llamacpp_host_memory_available_bytes")
        assert rss is not None and avail is not None
        rss_dev, avail_dev = abs(rss - ps_rss) / ps_rss, abs(avail - free_avail) / free_avail
        print(
            f"\nRSS exporter={rss:.0f} ps={ps_rss} ({rss_dev:.2%}); MemAvailable exporter={avail:.0f} free={free_avail} ({avail_dev:.2%})"
        )
        assert rss > 0 and rss_dev <= 0.10
        assert avail_dev <= 0.10
        assert _get(s, "llamacpp_exporter_source_up", source="proc") == 1
        start = _get(s, "llamacpp_process_start_time_seconds")
        assert start is not None and abs(start - Path(f"/proc/{srv.pid}").stat().st_mtime) < 120
        assert _get(s, "llamacpp_host_memory_total_bytes") == pytest.approx(
            os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), rel=0.01
        )


POOL_CASES = [
    pytest.param(["-c", "512", "-np", "4", "-kvu"], 512, id="c512-np4-kvu"),
    pytest.param(["-np", "4", "-kvu", "--kv-unified-per-slot", "512"], 2048, id="np4-kvu-per-slot-512"),
    pytest.param(["-c", "1000", "-np", "3"], 1536, id="c1000-np3-streams-padded"),
]


@pytest.mark.parametrize(("args", "pool"), POOL_CASES)
def test_pool_capacity_from_the_command_line_equals_the_log(
    llama_server_bin: Path, tiny_llama_model: Path, tmp_path: Path, args: list[str], pool: int
) -> None:
    """At -lv 4 the log states the pool; the command line read from /proc gives the same figure."""
    with (
        LlamaServer(
            llama_server_bin, tiny_llama_model, [*args, "-lv", "4", "-t", "2"], log_file=tmp_path / "ls.log"
        ) as srv,
        _exporter(srv) as exporter,
    ):
        s = _samples(exporter.scrape())
        assert _info(s, "llamacpp_server_info")["capacity_source"] == "log_kv_cache"
        from_log = _get(s, "llamacpp_kv_pool_capacity_tokens")
        snap = ProcReader(pid=srv.pid).read()
        assert snap.process is not None
        from_cmdline = snap.process.command_line.pool_capacity()
        print(f"\n{' '.join(args)}: log {from_log}, command line {from_cmdline}")
        assert from_log == from_cmdline == pool


@pytest.mark.parametrize(("args", "pool"), POOL_CASES)
def test_pool_capacity_at_default_verbosity_comes_from_the_command_line(
    llama_server_bin: Path, tiny_llama_model: Path, tmp_path: Path, args: list[str], pool: int
) -> None:
    with (
        LlamaServer(llama_server_bin, tiny_llama_model, [*args, "-t", "2"], log_file=tmp_path / "ls.log") as srv,
        _exporter(srv) as exporter,
    ):
        assert not srv.log_lines("llama_kv_cache: size")  # hidden at the default verbosity
        s = _samples(exporter.scrape())
        info = _info(s, "llamacpp_server_info")
        assert (_get(s, "llamacpp_kv_pool_capacity_tokens"), info["capacity_source"]) == (pool, "command_line")
        assert info["build"] == "b11434"  # from /props: the build line is hidden too
        assert _get(s, "llamacpp_log_verbosity") == 3
        out = exporter.output_file.read_text()
        assert out.count("llama-server logs at verbosity 3 (< 4)") == 1, out


def test_pool_capacity_from_llama_arg_environment(
    llama_server_bin: Path, tiny_llama_model: Path, tmp_path: Path
) -> None:
    env = {"LLAMA_ARG_CTX_SIZE": "512", "LLAMA_ARG_N_PARALLEL": "4", "LLAMA_ARG_KV_UNIFIED": "1"}
    with (
        LlamaServer(llama_server_bin, tiny_llama_model, ["-t", "2"], log_file=tmp_path / "ls.log", env=env) as srv,
        _exporter(srv) as exporter,
    ):
        assert srv.log_lines("initializing, n_slots = 4, n_ctx_slot = 512, kv_unified = 'true'")
        s = _samples(exporter.scrape())
        assert (_get(s, "llamacpp_kv_pool_capacity_tokens"), _info(s, "llamacpp_server_info")["capacity_source"]) == (
            512,
            "command_line",
        )


# ---------------------------------------------------------------- acceptance 3: slot tokens against /slots


def _slots_tokens(url: str) -> dict[int, int]:
    status, body = http_json(url + "/slots", timeout=10)
    assert status == 200, body
    return {int(s["id"]): int(s.get("n_prompt_tokens", 0)) for s in body["_"]}


def test_slot_tokens_follow_slots_during_long_generations(
    llama_server_bin: Path, tiny_llama_model: Path, tmp_path: Path, promtool_bin: Path
) -> None:
    args = ["-c", "32768", "-np", "4", "-kvu", "-lv", "4", "--slots", "-t", "2"]
    with (
        LlamaServer(llama_server_bin, tiny_llama_model, args, log_file=tmp_path / "ls.log") as srv,
        _exporter(srv) as exporter,
    ):
        done = threading.Event()

        def generate() -> None:
            try:
                run_concurrent_completions(srv.url, n=4, n_predict=12000, timeout=120)
            except Exception:  # the server is stopped under the requests at the end of the test
                pass
            finally:
                done.set()

        threading.Thread(target=generate, daemon=True).start()
        wait_for(lambda: min(_slots_tokens(srv.url).values()) >= 1500, timeout=60, what="four slots past 1500 tokens")
        worst = 0.0
        for _ in range(3):
            s = _samples(exporter.scrape())
            after = _slots_tokens(srv.url)
            assert _get(s, "llamacpp_slot_tokens_source", source="slots_endpoint") == 1
            scraped = {i: _get(s, "llamacpp_slot_tokens", slot=str(i)) for i in range(4)}
            for i in range(4):
                value = scraped[i]
                assert value is not None
                dev = abs(value - after[i]) / after[i]
                worst = max(worst, dev)
                assert dev <= 0.02, (i, scraped, after)
            assert _get(s, "llamacpp_kv_pool_used_tokens") == sum(v for v in scraped.values() if v is not None)
            print(f"\nscrape {scraped} vs /slots right after {after}")
        print(f"worst slot deviation from /slots: {worst:.3%}")
        assert not done.is_set(), "the generations ended before the comparison"
        # promtool's linter has nothing to say about a scrape with every live family in it.
        lint = subprocess.run(
            [str(promtool_bin), "check", "metrics"], input=exporter.scrape().encode(), capture_output=True, timeout=30
        )
        assert lint.returncode == 0 and not lint.stdout.strip() and not lint.stderr.strip(), lint


# ---------------------------------------------------------------- acceptance 4: up, loading, API key


def test_up_is_zero_in_the_first_scrape_after_a_kill(
    llama_server_bin: Path, tiny_llama_model: Path, tmp_path: Path
) -> None:
    with (
        LlamaServer(llama_server_bin, tiny_llama_model, ["-c", "512", "-t", "2"], log_file=tmp_path / "ls.log") as srv,
        _exporter(srv) as exporter,
    ):
        s = _samples(exporter.scrape())
        assert (_get(s, "llamacpp_up"), _get(s, "llamacpp_server_loading")) == (1, 0)
        assert _get(s, "llamacpp_exporter_source_up", source="http") == 1
        pid = srv.pid
        srv.kill9()
        started = time.monotonic()
        s = _samples(exporter.scrape())  # the very next scrape
        took = time.monotonic() - started
        print(f"\nscrape right after kill -9: llamacpp_up={_get(s, 'llamacpp_up')} in {took * 1000:.0f} ms")
        assert _get(s, "llamacpp_up") == 0 and _get(s, "llamacpp_exporter_source_up", source="http") == 0
        assert _get(s, "llamacpp_exporter_source_up", source="proc") == 0
        # A new process: one start, whichever of the log and /proc sees it first.
        starts = _get(s, "llamacpp_server_starts_total")
        srv.start()
        assert srv.pid != pid
        wait_for(lambda: exporter.sample("llamacpp_up") == 1, timeout=30, what="llamacpp_up back to 1")
        for _ in range(3):
            assert exporter.sample("llamacpp_server_starts_total") == (starts or 0) + 1


def test_loading_is_seen_while_a_real_model_loads(llama_server_bin: Path, tmp_path: Path) -> None:
    model = write_slow_loading_model(tmp_path / "slow.gguf", size_mib=2048)
    port = free_port()
    log_file = tmp_path / "ls.log"
    log_file.touch()
    try:
        with ExporterProcess(log_file, ["--server-url", f"http://127.0.0.1:{port}"]) as exporter:
            assert exporter.sample("llamacpp_up") == 0
            srv = LlamaServer(
                llama_server_bin,
                model,
                [*SLOW_LOAD_SERVER_ARGS, "-c", "512", "-t", "2"],
                log_file=log_file,
                port=port,
                wait_ready=False,
            )
            with srv:
                seen: list[tuple[float | None, float | None]] = []

                def loading_seen() -> bool:
                    s = _samples(exporter.scrape())
                    seen.append((_get(s, "llamacpp_up"), _get(s, "llamacpp_server_loading")))
                    h = srv.health()
                    if h is not None and h[0] == 200 and seen[-1][1] != 1:
                        raise AssertionError(f"the server became ready before a scrape saw it loading: {seen}")
                    return seen[-1] == (0, 1)

                wait_for(loading_seen, timeout=60, interval=0.05, what="llamacpp_server_loading 1")
                srv.wait_healthy(60)
                wait_for(lambda: exporter.sample("llamacpp_server_loading") == 0, timeout=10, what="loading back to 0")
                assert exporter.sample("llamacpp_up") == 1
                print(f"\nscrapes until loading seen: {len(seen)}; last (up, loading) = {seen[-1]}")
    finally:
        model.unlink(missing_ok=True)  # 2 GiB: do not leave it in pytest's kept temp dirs


@pytest.fixture
def keyed_server(llama_server_bin: Path, tiny_llama_model: Path, tmp_path: Path) -> Iterator[LlamaServer]:
    args = ["-c", "512", "-np", "2", "-kvu", "-t", "2", "--api-key", "s3cret-key"]
    with LlamaServer(llama_server_bin, tiny_llama_model, args, log_file=tmp_path / "ls.log") as srv:
        yield srv


def test_api_key_works_when_given(keyed_server: LlamaServer, tmp_path: Path) -> None:
    assert http_request(keyed_server.url + "/slots")[0] == 401
    key_file = tmp_path / "key"
    key_file.write_text("# llama-server key\ns3cret-key\n")
    with _exporter(keyed_server, "--api-key-file", str(key_file)) as exporter:
        s = _samples(exporter.scrape())
        assert _get(s, "llamacpp_exporter_http_status", endpoint="/slots") == 200
        assert _get(s, "llamacpp_exporter_source_up", source="http") == 1
        assert _get(s, "llamacpp_slot_tokens_source", source="slots_endpoint") == 1
        assert "s3cret-key" not in exporter.output_file.read_text()
    with _exporter(keyed_server, env={"LLAMACPP_EXPORTER_API_KEY": "s3cret-key"}) as exporter:
        assert exporter.sample("llamacpp_exporter_http_status", {"endpoint": "/props"}) == 200


def test_api_key_missing_is_a_clear_error_not_a_crash(keyed_server: LlamaServer) -> None:
    env = dict.fromkeys(("LLAMA_API_KEY", "LLAMACPP_EXPORTER_API_KEY", "LLAMACPP_EXPORTER_API_KEY_FILE"), "")
    with _exporter(keyed_server, env=env) as exporter:
        for _ in range(3):
            s = _samples(exporter.scrape())  # 200 every time
            assert _get(s, "llamacpp_up") == 1  # /health is public
            assert _get(s, "llamacpp_exporter_http_status", endpoint="/slots") == 401
            assert _get(s, "llamacpp_exporter_source_up", source="http") == 0
            assert _get(s, "llamacpp_slot_tokens_source", source="log") == 1
        out = exporter.output_file.read_text()
        assert out.count("requires an API key; set --api-key") == 1, out
        assert "Traceback" not in out


# ---------------------------------------------------------------- acceptance 5: every source failing at once


def test_every_source_failing_answers_within_a_second(tmp_path: Path) -> None:
    log_file = B11434 / "exhaust-lv4" / "llama-server.log"
    empty_proc = tmp_path / "proc"
    empty_proc.mkdir()
    # A source timeout far above the scrape's own: a scrape that waited for a failing source would not answer.
    args = ["--proc-root", str(empty_proc), "--server-url", f"http://127.0.0.1:{free_port()}", "--nvml", "on"]
    args += ["--server-timeout", "30"]
    with ExporterProcess(log_file, args, output_file=tmp_path / "exporter.out") as exporter:
        took: list[float] = []
        for _ in range(5):
            started = time.monotonic()
            status, raw = http_request(exporter.url + "/metrics", timeout=20)
            took.append(time.monotonic() - started)
            assert status == 200
        s = _samples(raw.decode())
        print(
            f"\nscrape latency with every live source failing: max {max(took) * 1000:.0f} ms ({[round(t * 1000) for t in took]})"
        )
        assert [_get(s, "llamacpp_exporter_source_up", source=x) for x in ("log", "nvml", "proc", "http")] == [
            1,
            0,
            0,
            0,
        ]
        assert _get(s, "llamacpp_up") == 0
        assert _get(s, "llamacpp_kv_pool_capacity_tokens") == 512 and _get(s, "llamacpp_slots") == 4
        out = exporter.output_file.read_text()
        for source in ("nvml", "proc", "http"):
            assert out.count(f"source {source} down") == 1, out


def test_standard_input_pipe_finds_the_server_writing_into_it(
    llama_server_bin: Path, tiny_llama_model: Path, tmp_path: Path
) -> None:
    """`llama-server … 2>&1 | llamacpp-exporter --log-file -`: /proc finds the server by the pipe."""
    port, exporter_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
    server_argv = [str(llama_server_bin), "-m", str(tiny_llama_model), "--host", "127.0.0.1", "--port", str(port)]
    server = subprocess.Popen(
        [*server_argv, "-c", "512", "-np", "4", "-kvu", "-t", "2"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**env, "OMP_WAIT_POLICY": "passive"},
    )
    out = tmp_path / "exporter.out"
    with out.open("wb") as sink:
        exporter_argv = [sys.executable, "-m", "exporter", "--log-file", "-"]
        exporter = subprocess.Popen(
            [
                *exporter_argv,
                "--listen-address",
                f"127.0.0.1:{exporter_port}",
                "--server-url",
                f"http://127.0.0.1:{port}",
            ],
            stdin=server.stdout,
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
    assert server.stdout is not None
    server.stdout.close()  # the exporter holds the read end now
    try:

        def scraped() -> Samples | None:
            try:
                status, raw = http_request(f"http://127.0.0.1:{exporter_port}/metrics", timeout=5)
            except OSError:
                return None
            s = _samples(raw.decode()) if status == 200 else {}
            return s if _get(s, "llamacpp_exporter_source_up", source="proc") == 1 and _get(s, "llamacpp_up") else None

        s = wait_for(scraped, timeout=30, what="the exporter on stdin finding llama-server in /proc")
        assert _get(s, "llamacpp_kv_pool_capacity_tokens") == 512
        assert _info(s, "llamacpp_server_info")["capacity_source"] == "command_line"
        assert _get(s, "llamacpp_process_resident_memory_bytes")
    finally:
        for p in (exporter, server):
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
