"""The psutil process source (what Windows and macOS use) on this Linux host, against real processes and
the real llama-server, beside the /proc reader: the same `/metrics` from both on one server (RSS within
1 %, the same command-line facts and `found_by`), servers naming or writing the log, a reader of the log
never taken, zombies and exited processes, router children. The foreign-server tests run on both sources
in test_sources_procfs_real.py; psutil's refusals (AccessDenied, no open modes) are in
tests/unit/test_sources_psutil.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from llama_harness import ExporterProcess, LlamaServer, wait_for
from prometheus_client.parser import text_string_to_metric_families

from exporter.sources.process import port_of
from exporter.sources.procfs import ProcReader
from exporter.sources.psutil_reader import PsutilReader

SLEEPER = "import time; time.sleep(60)"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.mark.llama_server
def test_metrics_from_psutil_equal_those_from_proc_on_a_real_llama_server(
    llama_server_bin: Path, tiny_llama_model: Path, tmp_path: Path
) -> None:
    """One real llama-server (settings on its command line and in LLAMA_ARG_* variables), two exporters:
    one on /proc, one on psutil. Their series are the same; their values too, RSS within 1 %."""
    args = ["-c", "1024", "-kvu", "-t", "2"]
    with LlamaServer(
        llama_server_bin, tiny_llama_model, args, log_file=tmp_path / "ls.log", env={"LLAMA_ARG_N_PARALLEL": "2"}
    ) as srv:
        # No HTTP source: its requests make llama-server allocate while the other exporter reads its RSS.
        common = ["--server-url", srv.url, "--nvml", "off", "--http", "off"]
        with (
            ExporterProcess(srv.log_file, [*common, "--process-source", "procfs"]) as by_proc,
            ExporterProcess(srv.log_file, [*common, "--process-source", "psutil"]) as by_psutil,
        ):
            a, b = _samples(by_proc.scrape()), _samples(by_psutil.scrape())
            a2 = _samples(by_proc.scrape())
    keys = {k for k in a if k[0].startswith("llamacpp_")}
    assert keys == {k for k in b if k[0].startswith("llamacpp_")}, set(a) ^ set(b)
    assert a[("llamacpp_exporter_source_up", (("source", "proc"),))] == 1
    assert b[("llamacpp_exporter_source_up", (("source", "proc"),))] == 1
    assert b[("llamacpp_process_found_by", (("how", "log_file"),))] == 1
    rss = "llamacpp_process_resident_memory_bytes", ()
    low, high = sorted((a[rss], a2[rss]))
    print(f"\nRSS: /proc {a[rss]:.0f} and {a2[rss]:.0f}, psutil {b[rss]:.0f} bytes")
    assert low * 0.99 <= b[rss] <= high * 1.01
    start = "llamacpp_process_start_time_seconds", ()
    assert abs(a[start] - b[start]) < 0.02  # both: the boot time plus the start in clock ticks
    facts = [k for k in keys if k[0] in _COMMAND_LINE_FACTS]
    assert {f[0] for f in facts} == set(_COMMAND_LINE_FACTS)
    assert [(k, b[k]) for k in sorted(facts)] == [(k, a[k]) for k in sorted(facts)]
    assert a[("llamacpp_kv_pool_capacity_tokens", ())] == 1024 and a[("llamacpp_slots", ())] == 2  # -np from env
    total = a[("llamacpp_host_memory_total_bytes", ())]
    assert total == b[("llamacpp_host_memory_total_bytes", ())]
    available = "llamacpp_host_memory_available_bytes", ()
    assert abs(a[available] - b[available]) < 0.05 * total  # MemAvailable, read a moment apart


# Series whose values come from llama-server's command line and environment (and the process's identity).
_COMMAND_LINE_FACTS = (
    "llamacpp_process_found_by",
    "llamacpp_server_info",
    "llamacpp_kv_pool_capacity_tokens",
    "llamacpp_slots",
    "llamacpp_slot_context_tokens",
    "llamacpp_server_starts_total",
)


def _samples(text: str) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): float(s.value)
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def _spawn(argv0: str, args: list[str], cwd: Path | None = None, **kw: object) -> subprocess.Popen[bytes]:
    """A real process whose argv[0] is `argv0` (like `exec -a`) that sleeps."""
    return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
        ["bash", "-c", f'exec -a {argv0} "$0" -c "$1" "${{@:2}}"', sys.executable, SLEEPER, *args], cwd=cwd, **kw
    )


def _exec_done(proc: subprocess.Popen[bytes], argv0: str) -> None:
    wait_for(lambda: psutil.Process(proc.pid).cmdline()[:1] == [argv0], timeout=10, what=f"{argv0} exec'd")


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        p.kill()
        p.wait()


def _only(*popens: subprocess.Popen[bytes]) -> Callable[[], list[psutil.Process]]:
    """The processes a reader may look at: these only, so that other llama-servers on the host do not count."""
    return lambda: [psutil.Process(p.pid) for p in popens if psutil.pid_exists(p.pid)]


def test_the_server_naming_its_log_relative_to_its_cwd_reads_as_the_proc_reader_does(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    log = tmp_path / "logs" / "llama-server.log"
    log.parent.mkdir()
    log.write_text("")
    env = {**os.environ, "LLAMA_ARG_CACHE_TYPE_K": "q8_0", "LLAMA_ARG_N_PARALLEL": "4"}
    server = _spawn("llama-server", ["--log-file", "logs/llama-server.log", "-c", "8192", "-kvu"], tmp_path, env=env)
    procs.append(server)
    _exec_done(server, "llama-server")
    via_proc = ProcReader(log_file=str(log)).read()
    via_psutil = PsutilReader(log_file=str(log), processes=_only(server)).read()
    assert via_psutil.ok and via_proc.ok, (via_psutil.error, via_proc.error)
    a, b = via_psutil.process, via_proc.process
    assert a is not None and b is not None
    assert (a.pid, a.found_by, a.command_line, a.environ_readable) == (b.pid, b.found_by, b.command_line, True)
    assert (a.pid, a.found_by) == (server.pid, "log_file")
    assert a.command_line.type_k == "q8_0" and a.command_line.pool_capacity() == 8192
    after = ProcReader(log_file=str(log)).read().process  # RSS moves while Python starts: bracket the read
    assert after is not None
    low, high = sorted((b.rss_bytes, after.rss_bytes))
    assert low * 0.99 <= a.rss_bytes <= high * 1.01
    assert a.start_time_seconds is not None and b.start_time_seconds is not None
    assert abs(a.start_time_seconds - b.start_time_seconds) < 0.05  # both: boot time + start ticks
    assert via_psutil.host is not None and via_psutil.host.total_bytes == via_proc.host.total_bytes  # type: ignore[union-attr]


def test_a_server_writing_the_log_is_found_and_a_reader_of_it_is_not(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    log = tmp_path / "llama-server.log"
    log.write_text("")
    with log.open("rb") as r:
        tail = _spawn("tail", [], stdout=subprocess.DEVNULL, stdin=r)  # holds the log open for reading
    with log.open("ab") as w:
        renamed = _spawn("my-llama", [], stdout=w)  # a renamed binary writing it
    procs += [tail, renamed]
    _exec_done(tail, "tail")
    _exec_done(renamed, "my-llama")
    snap = PsutilReader(log_file=str(log), processes=_only(tail, renamed)).read()
    assert snap.process is not None and (snap.process.pid, snap.process.found_by) == (renamed.pid, "log_file")


def test_open_files_without_their_mode_take_only_a_llama_server(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    """On Windows and macOS psutil lists open files without their mode: a llama-server holding the log
    writes it; any other process holding it (an editor, a tail) cannot be told from a writer: not taken."""
    log = tmp_path / "llama-server.log"
    log.write_text("")
    with log.open("ab") as w:
        renamed = _spawn("my-llama", [], stdout=w)
        server = _spawn("llama-server", [], stdout=w)
    procs += [renamed, server]
    _exec_done(renamed, "my-llama")
    _exec_done(server, "llama-server")
    reader = PsutilReader(log_file=str(log), processes=_only(renamed))
    reader._modes = False  # as psutil reports open files on Windows and macOS
    snap = reader.read()
    assert snap.process is None and snap.error is not None and "no llama-server process writing" in snap.error
    reader = PsutilReader(log_file=str(log), processes=_only(renamed, server))
    reader._modes = False
    snap = reader.read()
    assert snap.process is not None and (snap.process.pid, snap.process.found_by) == (server.pid, "log_file")


def test_another_users_environment_refused_leaves_the_command_line(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """macOS refuses another user's environment (AccessDenied): the command line alone counts, said in the snapshot."""
    log = tmp_path / "llama-server.log"
    log.write_text("")
    server = _spawn(
        "llama-server", ["--log-file", str(log), "-c", "4096"], env={**os.environ, "LLAMA_ARG_N_PARALLEL": "2"}
    )
    procs.append(server)
    _exec_done(server, "llama-server")

    def refuse(self: psutil.Process) -> dict[str, str]:
        raise psutil.AccessDenied(self.pid, "llama-server")

    monkeypatch.setattr(psutil.Process, "environ", refuse)
    snap = PsutilReader(log_file=str(log), processes=_only(server)).read()
    assert snap.ok and snap.process is not None
    assert (snap.process.found_by, snap.process.environ_readable) == ("log_file", False)
    assert snap.process.command_line.pool_capacity() == 4096 and snap.process.command_line.n_parallel is None


def test_exited_zombie_and_racing_processes(procs: list[subprocess.Popen[bytes]]) -> None:
    zombie = _spawn("llama-server", [])
    procs.append(zombie)
    _exec_done(zombie, "llama-server")
    os.kill(zombie.pid, 9)
    wait_for(lambda: psutil.Process(zombie.pid).status() == psutil.STATUS_ZOMBIE, timeout=10, what="a zombie")
    snap = PsutilReader(pid=zombie.pid).read()
    assert snap.process is None and snap.error == f"llama-server pid {zombie.pid} (pid) is not running"
    assert PsutilReader(processes=_only(zombie)).read().process is None
    listed = psutil.Process(zombie.pid)
    zombie.wait()  # reaped: the process listed a moment ago is gone (NoSuchProcess)
    snap = PsutilReader(processes=lambda: [listed]).read()
    assert snap.process is None and snap.error is not None and "no llama-server process" in snap.error
    snap = PsutilReader(pid=zombie.pid).read()
    assert snap.process is None and snap.error == f"llama-server pid {zombie.pid} (pid) is not running"


def test_router_children_are_found_by_their_port(procs: list[subprocess.Popen[bytes]]) -> None:
    # A stand-in router: a process that starts two children named llama-server, each with its --port.
    child = f'exec -a llama-server "$0" -c "{SLEEPER}" "$@"'
    spawn = f"import subprocess, sys\nfor port in ('40001', '40002'): subprocess.Popen(['bash', '-c', {child!r}, sys.executable, '--port', port])"
    router = subprocess.Popen([sys.executable, "-c", f"{spawn}\n{SLEEPER}"])
    procs.append(router)
    wait_for(
        lambda: sorted(port_of(k.cmdline()) or "" for k in psutil.Process(router.pid).children()) == ["40001", "40002"],
        timeout=10,
        what="two children",
    )
    try:
        by_psutil = PsutilReader(router_pid=lambda: router.pid, port=40002).read()
        by_proc = ProcReader(router_pid=lambda: router.pid, port=40002).read()
        assert by_psutil.process is not None and by_proc.process is not None
        assert (by_psutil.process.pid, by_psutil.process.found_by) == (by_proc.process.pid, "router")
        assert "no child of router" in (PsutilReader(router_pid=lambda: router.pid, port=1).read().error or "")
    finally:
        for k in psutil.Process(router.pid).children():
            k.kill()


def test_the_server_in_our_pipeline_writes_our_standard_input(procs: list[subprocess.Popen[bytes]]) -> None:
    """psutil lists no pipes: with `--log-file -` the llama-server started by the exporter's parent (the
    shell of `llama-server … | llamacpp-exporter --log-file -`) is the writer, when there is exactly one."""
    read_end, write_end = os.pipe()
    try:
        exporter = _spawn("llamacpp-exporter", [])  # stands for the exporter: a sibling of the servers below
        server = _spawn("llama-server", [], stdout=write_end)
        outsider = subprocess.Popen(["bash", "-c", f'exec -a llama-server "$0" -c "{SLEEPER}" & wait', sys.executable])
        procs += [exporter, server, outsider]
        for p, name in ((exporter, "llamacpp-exporter"), (server, "llama-server")):
            _exec_done(p, name)
        wait_for(lambda: psutil.Process(outsider.pid).children(), timeout=10, what="a llama-server not ours")
        (other,) = psutil.Process(outsider.pid).children()
        wait_for(lambda: other.cmdline()[:1] == ["llama-server"], timeout=10, what="llama-server exec'd")
        among = _only(server, outsider)

        def listed() -> list[psutil.Process]:
            return [*among(), other]

        snap = PsutilReader(stdin_fd=read_end, self_pid=exporter.pid, processes=listed).read()
        assert snap.process is not None and (snap.process.pid, snap.process.found_by) == (server.pid, "log_file")
        second = _spawn("llama-server", [])  # two servers in the pipeline: neither is known to be the writer
        procs.append(second)
        _exec_done(second, "llama-server")
        snap = PsutilReader(
            stdin_fd=read_end, self_pid=exporter.pid, processes=lambda: [*listed(), psutil.Process(second.pid)]
        ).read()
        assert snap.process is None and snap.error is not None and "none is known to write standard input" in snap.error
        other.kill()  # the outsider's child: killing the outsider (the fixture) would leave it behind
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_llama_server_outside_our_pipeline_is_never_taken_for_the_writer_of_our_standard_input(
    procs: list[subprocess.Popen[bytes]],
) -> None:
    """Our standard input written by no llama-server (a test, `cat`): a llama-server elsewhere on the host is
    neither our parent's child nor started by a process of our pipeline, so it cannot write into our pipe, and
    is not taken by its name (as the /proc reader, which sees the pipe, never takes it)."""
    read_end, write_end = os.pipe()
    exporter: psutil.Process | None = None
    try:
        # The exporter's parent is a shell of its own (`; true` keeps bash from exec'ing its last command).
        shell = subprocess.Popen(
            [
                "bash",
                "-c",
                'bash -c \'exec -a llamacpp-exporter "$0" -c "$1"\' "$0" "$1"; true',
                sys.executable,
                SLEEPER,
            ]
        )
        outsider = _spawn("llama-server", [])  # the test's child: started outside the exporter's pipeline
        procs += [shell, outsider]
        _exec_done(outsider, "llama-server")
        wait_for(lambda: psutil.Process(shell.pid).children(), timeout=10, what="the exporter's process")
        (exporter,) = psutil.Process(shell.pid).children()
        wait_for(lambda: exporter.cmdline()[:1] == ["llamacpp-exporter"], timeout=10, what="the exporter exec'd")
        snap = PsutilReader(stdin_fd=read_end, self_pid=exporter.pid, processes=_only(outsider)).read()
        assert snap.process is None, snap.process
        assert "not ours" in (snap.error or ""), snap.error
    finally:
        if exporter is not None:
            exporter.kill()
        os.close(read_end)
        os.close(write_end)
