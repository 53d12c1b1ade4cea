"""/proc source against the checked-in fake trees in tests/fixtures/proc/ (like client_python's tests/proc).

Scenarios: `single` (llama-server names its log relative to its cwd; the exporter names it too),
`writer` (a renamed binary writes the log; an unrelated llama-server and a `tail -f` reader), `ambiguous`
(two llama-servers, neither related to the log), `zombie`. Real processes (a
renamed binary writing the log, our stdin pipe, a server started after the exporter) are in
tests/real_server/test_sources_procfs_real.py; the real llama-server is in test_live_server.py.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from paths import FIXTURES
from prometheus_client import CollectorRegistry

from exporter.logs.events import BuildInfo, ServerStarting, SlotReleased, TaskStarted
from exporter.metrics.process import ProcCollector
from exporter.model.live import ProcSnapshot
from exporter.model.state import ServerState
from exporter.model.view import merge_view
from exporter.sources.live import LiveSources
from exporter.sources.procfs import ProcReader

PROC = FIXTURES / "proc"
LOG = "/srv/llama/logs/llama-server.log"  # what llama-server 4242 in `single` names (relative to its cwd)
WRITER_LOG = str(PROC / "logs" / "llama-server.log")  # what pid 5000 in `writer` holds open for writing
EXPORTER_PID = 4243  # the fake exporter in `single`: it names the log too, and must never match


def _reader(scenario: str, **kw: object) -> ProcReader:
    kw.setdefault("self_pid", EXPORTER_PID)
    return ProcReader(PROC / scenario, page_size=4096, clock_ticks=100, **kw)  # type: ignore[arg-type]


def _registry(snap: ProcSnapshot) -> CollectorRegistry:
    reg = CollectorRegistry()
    reg.register(ProcCollector(lambda: snap))
    return reg


def test_finds_the_server_that_names_the_log_relative_to_its_cwd() -> None:
    snap = _reader("single", log_file=LOG).read()
    assert snap.ok and snap.error is None
    p = snap.process
    assert p is not None
    assert (p.pid, p.found_by, p.start_ticks) == (4242, "log_file", 123456)
    assert p.rss_bytes == 51200 * 4096
    assert p.start_time_seconds == pytest.approx(1_700_000_000 + 1234.56)
    cfg = p.command_line
    assert (cfg.pool_capacity(), cfg.slot_count(), cfg.unified()) == (512, 4, True)
    assert cfg.type_k == "q8_0"  # from LLAMA_ARG_CACHE_TYPE_K in its environ
    assert cfg.api_key_set and "not-a-real-key" not in repr(snap)

    reg = _registry(snap)
    assert reg.get_sample_value("llamacpp_process_resident_memory_bytes") == 51200 * 4096
    assert reg.get_sample_value("llamacpp_process_start_time_seconds") == pytest.approx(1_700_001_234.56)
    assert reg.get_sample_value("llamacpp_host_memory_available_bytes") == 23363268 * 1024
    assert reg.get_sample_value("llamacpp_host_memory_total_bytes") == 24684084 * 1024


def test_the_exporter_itself_never_matches() -> None:
    # Were the fake exporter some other process, it still is not named llama-server: 4242 wins.
    snap = _reader("single", log_file=LOG, self_pid=1).read()
    assert snap.process is not None and snap.process.pid == 4242


def test_a_renamed_binary_writing_the_log_is_found_not_the_reader_or_another_server() -> None:
    snap = _reader("writer", log_file=WRITER_LOG).read()
    assert snap.process is not None
    assert (snap.process.pid, snap.process.found_by) == (5000, "log_file")
    assert snap.process.command_line.slot_count() == 2


def test_name_fallback_only_when_there_is_exactly_one() -> None:
    # No log relation at all (standard input): the only llama-server is taken, by name.
    snap = _reader("single").read()
    assert snap.process is not None and (snap.process.pid, snap.process.found_by) == (4242, "name")
    # Two candidates and no log relation (the journal): none, with a reason that says what to do.
    snap = _reader("ambiguous").read()
    assert snap.process is None and not snap.ok
    assert snap.error is not None and "2 llama-server processes (6000, 6001)" in snap.error
    assert "--pid" in snap.error
    assert snap.host is not None and snap.host.available_bytes == 23363268 * 1024  # host memory still read
    reg = _registry(snap)
    assert reg.get_sample_value("llamacpp_process_resident_memory_bytes") is None
    assert reg.get_sample_value("llamacpp_host_memory_available_bytes") == 23363268 * 1024


def test_a_zombie_is_not_a_running_server() -> None:
    snap = _reader("zombie").read()
    assert snap.process is None and snap.error is not None and "no llama-server process" in snap.error
    snap = _reader("zombie", pid=7000).read()
    assert snap.process is None and snap.error is not None and "7000" in snap.error


def test_pid_and_pid_file(tmp_path: Path) -> None:
    snap = _reader("ambiguous", pid=6001).read()
    assert snap.process is not None and (snap.process.pid, snap.process.found_by) == (6001, "pid")
    assert _reader("ambiguous", pid=99999).read().process is None

    pid_file = tmp_path / "llama.pid"
    reader = _reader("ambiguous", pid_file=str(pid_file))
    snap = reader.read()
    assert snap.process is None and snap.error is not None and "--pid-file" in snap.error
    pid_file.write_text("6000\n")
    snap = reader.read()
    assert snap.process is not None and (snap.process.pid, snap.process.found_by) == (6000, "pid_file")
    pid_file.write_text("6001")  # read at every scrape: a restarted server is followed
    assert reader.read().process is not None and reader.read().process.pid == 6001  # type: ignore[union-attr]
    pid_file.write_text("garbage")
    snap = reader.read()
    assert snap.process is None and snap.error is not None and "expected a pid" in snap.error
    pid_file.write_bytes(b"\x1f\x8b\x08\x00binary")  # not UTF-8: still the same one-line message naming the file
    snap = reader.read()
    assert snap.error is not None and snap.error.startswith(f"--pid-file {pid_file}: expected a pid")


def test_a_missing_proc_root_is_a_value_not_an_exception(tmp_path: Path) -> None:
    snap = ProcReader(tmp_path / "nothing", log_file=LOG).read()
    assert snap.process is None and snap.host is None and snap.error is not None
    assert list(_registry(snap).collect()) == []


def test_rss_is_statm_s_exact_count_where_there_is_one(tmp_path: Path) -> None:
    """`stat`'s RSS is the kernel's per-CPU estimate (measured: 50-65 pages low on a busy llama-server);
    `statm` has the exact sum, as `VmRSS` and psutil count it. Without `statm`, `stat`'s figure stays."""
    root = _copy("single", tmp_path)
    (root / "4242" / "statm").write_text("120000 51264 3000 100 0 60000 0\n")
    snap = ProcReader(root, log_file=LOG, self_pid=EXPORTER_PID, page_size=4096, clock_ticks=100).read()
    assert snap.process is not None and snap.process.rss_bytes == 51264 * 4096
    (root / "4242" / "statm").write_text("garbage")
    snap = ProcReader(root, log_file=LOG, self_pid=EXPORTER_PID, page_size=4096, clock_ticks=100).read()
    assert snap.process is not None and snap.process.rss_bytes == 51200 * 4096


def _copy(scenario: str, tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    shutil.copytree(PROC / scenario, root, symlinks=True)
    return root


def _restart(root: Path, old_pid: int, new_pid: int, start_ticks: int) -> None:
    """Make the fake server process `old_pid` exit and `new_pid` start."""
    (root / str(old_pid)).rename(root / str(new_pid))
    stat = root / str(new_pid) / "stat"
    fields = stat.read_text().split(" ")
    fields[0], fields[21] = str(new_pid), str(start_ticks)
    stat.write_text(" ".join(fields))


def test_found_pid_is_kept_while_it_lives_and_rescanned_after(tmp_path: Path) -> None:
    root = _copy("single", tmp_path)
    reader = ProcReader(root, log_file=LOG, self_pid=EXPORTER_PID, page_size=4096, clock_ticks=100)
    assert reader.read().process.pid == 4242  # type: ignore[union-attr]
    # Same pid, new start time: another process reused the pid. It is found again, with its new identity.
    _restart(root, 4242, 4242, 999999)
    p = reader.read().process
    assert p is not None and (p.pid, p.start_ticks) == (4242, 999999)
    _restart(root, 4242, 4300, 1000000)
    p = reader.read().process
    assert p is not None and (p.pid, p.start_ticks) == (4300, 1000000)


def test_the_server_found_then_gone_is_said_to_have_exited_until_another_is_found(tmp_path: Path) -> None:
    """A crash or a kill writes no line: the reader says the process it had found has exited (the status page's
    `down`), never a server it never found (one in another container is unseen, not down), and not once a new
    server writes the log."""
    root = _copy("single", tmp_path)
    never = ProcReader(root / "missing", log_file=LOG, self_pid=EXPORTER_PID, page_size=4096, clock_ticks=100)
    assert never.read().exited is None
    reader = ProcReader(root, log_file=LOG, self_pid=EXPORTER_PID, page_size=4096, clock_ticks=100)
    assert reader.read().exited is None
    saved = tmp_path / "saved"
    (root / "4242").rename(saved)  # killed: its pid is gone
    snap = reader.read()
    assert snap.process is None and snap.exited == 4242
    saved.rename(root / "4242")
    _restart(root, 4242, 4242, 999999)  # the pid reused by the next start: a new process, found and running
    snap = reader.read()
    assert snap.process is not None and snap.process.start_ticks == 999999 and snap.exited is None
    (root / "4242").rename(saved)
    assert reader.read().exited == 4242


# ---------------------------------------------------------------- a new pid is a server start, counted once


def _started_state() -> ServerState:
    st = ServerState()
    st.apply(ServerStarting())
    st.apply(BuildInfo(11434, "b11434"))
    st.apply(TaskStarted(0, 1))
    st.apply(SlotReleased(0, 1, 100))
    return st


def test_first_process_seen_is_not_a_start() -> None:
    st = _started_state()
    assert st.server_starts == 1  # the banner, read live
    st.observe_process(100, 5)
    st.observe_process(100, 5)
    assert st.server_starts == 1


def test_banner_first_then_new_pid_counts_once() -> None:
    st = _started_state()
    st.observe_process(100, 5)
    st.apply(ServerStarting())
    st.apply(BuildInfo(11434, "b11434"))
    assert st.server_starts == 2
    st.observe_process(200, 9)
    st.observe_process(200, 9)
    assert st.server_starts == 2
    assert st.run.build == 11434  # the new server's configuration is kept: the log already reset it


def test_new_pid_first_then_banner_counts_once() -> None:
    st = _started_state()
    st.observe_process(100, 5)
    assert st.run.slots[0].tokens == 100
    st.observe_process(200, 9)
    assert st.server_starts == 2
    assert st.run.slots == {} and st.run.build is None  # a new process holds nothing yet
    st.apply(ServerStarting())
    st.apply(BuildInfo(11434, "b11434"))
    assert st.server_starts == 2 and st.run.build == 11434
    # And the next restart is counted again, in either order.
    st.apply(SlotReleased(0, 2, 50))  # work: the start-up is over
    st.observe_process(300, 12)
    st.apply(ServerStarting())
    assert st.server_starts == 3
    st.apply(SlotReleased(0, 3, 50))
    st.apply(ServerStarting())
    st.observe_process(400, 15)
    assert st.server_starts == 4


def test_pid_reuse_with_a_new_start_time_is_a_new_process() -> None:
    st = _started_state()
    st.observe_process(100, 5)
    st.observe_process(100, 6)
    assert st.server_starts == 2


def test_live_sources_apply_the_process_and_its_command_line(tmp_path: Path) -> None:
    """Through LiveSources: the proc read feeds observe_process and the command-line pool fallback."""
    root = _copy("single", tmp_path)
    st = ServerState()
    st.apply(ServerStarting())  # the default-verbosity log of a server: no pool line
    live = LiveSources(st, proc=ProcReader(root, log_file=LOG, self_pid=EXPORTER_PID, page_size=4096))

    asyncio.run(live.refresh())
    assert live.statuses["proc"].up and live.pid == 4242
    assert st.pool_capacity() == (512, "command_line")
    view = merge_view(st, live.http)
    assert view.run.type_k == "q8_0" and view.run.n_slots == 4
    starts = st.server_starts
    _restart(root, 4242, 4300, 777777)
    asyncio.run(live.refresh())
    assert st.server_starts == starts + 1 and live.pid == 4300
    shutil.rmtree(root / "4300")
    asyncio.run(live.refresh())
    assert not live.statuses["proc"].up and live.statuses["proc"].failures == 1
    # The last server's command line stays, like the rest of its state, until a new server is seen.
    assert st.pool_capacity() == (512, "command_line") and live.pid is None


# ---------------------------------------------------------------- the real /proc, with stand-in processes


def test_a_server_that_dies_while_it_starts_counts_each_start() -> None:
    """A crash loop during start-up (the banner again before the server listened): every start counts."""
    st = ServerState()
    for _ in range(3):
        st.apply(ServerStarting())
        st.apply(BuildInfo(11434, "b11434"))
    assert st.server_starts == 3
    st.provenance.new_file = True  # what the pipeline says when llama-server truncated its log to start
    st.apply(BuildInfo(11434, "b11434"))  # a start whose first visible line is the build line
    st.provenance.new_file = True
    st.apply(ServerStarting())  # and one whose predecessor printed only a build line
    assert st.server_starts == 5


def test_with_the_journal_as_the_log_the_server_is_the_one_in_the_units_cgroup(tmp_path: Path) -> None:
    """`--log-source journald`: the llama-server in the unit's cgroup, never a lone one by name (a
    foreign server on the host would otherwise be taken)."""
    root = tmp_path / "proc"
    shutil.copytree(PROC / "single", root, symlinks=True)
    (root / "4242" / "cgroup").write_text("0::/system.slice/llama-server.service\n")
    shutil.copytree(root / "4242", root / "5000", symlinks=True)  # a foreign llama-server, in a user session
    (root / "5000" / "cgroup").write_text("0::/user.slice/user-1000.slice/session-2.scope\n")
    (root / "4243" / "cgroup").write_text("0::/system.slice/llamacpp-exporter.service\n")
    for unit in ("llama-server.service", "llama-server"):
        snap = ProcReader(root, unit=unit, self_pid=EXPORTER_PID, page_size=4096, clock_ticks=100).read()
        assert snap.process is not None and (snap.process.pid, snap.process.found_by) == (4242, "unit")
    snap = ProcReader(root, unit="other.service", self_pid=EXPORTER_PID, page_size=4096, clock_ticks=100).read()
    assert snap.process is None and snap.error is not None and "cgroup of other.service" in snap.error
    (root / "4242" / "cgroup").unlink()  # cgroup unreadable: still never the foreign one by name
    snap = ProcReader(root, unit="llama-server.service", self_pid=EXPORTER_PID, page_size=4096, clock_ticks=100).read()
    assert snap.process is None
