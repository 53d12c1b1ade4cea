"""Several servers in one exporter: the labels, the series exported once, GPU sharing (at the pynvml
boundary), and `--servers-file`."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from fake_nvml import GIB, FakeNvml, h200
from follow_watch import HANG_GUARD, ManualClock, wait_until
from paths import B11434
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from exporter import unit as unit_mod
from exporter.logs import follow as follow_mod
from exporter.logs.file_source import FileSource
from exporter.logs.tail import LogTailer
from exporter.metrics.servers import ServersCollector, merge_units
from exporter.model.live import HttpSnapshot, ProcessInfo, ProcSnapshot
from exporter.model.server_cmdline import parse_command_line
from exporter.model.state import ServerState
from exporter.model.view import merge_view
from exporter.pipeline import LogPipeline
from exporter.servers_file import MAX_SERVERS, ServersFileError, parse_servers
from exporter.sources.live import LiveSources
from exporter.sources.nvml import NvmlReader
from exporter.unit import FollowedServer, refresh_all

CAPTURE = B11434 / "exhaust-lv4" / "llama-server.log"


class _Static:
    def __init__(self, *families: GaugeMetricFamily | InfoMetricFamily) -> None:
        self.families = families

    def collect(self) -> list[GaugeMetricFamily | InfoMetricFamily]:
        return list(self.families)


def test_merge_adds_each_units_labels_keeps_clashing_ones_and_exports_host_series_once() -> None:
    def unit(model: str, tokens: float, free: float) -> _Static:
        info = InfoMetricFamily("llamacpp_server", "x")
        info.add_metric([], {"model": f"/m/{model}.gguf", "build": "b1"})
        slot = GaugeMetricFamily("llamacpp_slot_tokens", "x", labels=["slot"])
        slot.add_metric(["0"], tokens)
        return _Static(info, slot, GaugeMetricFamily("llamacpp_host_memory_available_bytes", "x", value=free))

    merged = list(merge_units([({"model": "alpha"}, [unit("alpha", 5, 1)]), ({"model": "beta"}, [unit("beta", 7, 2)])]))
    by_name = {m.name: m for m in merged}
    assert [s.labels for s in by_name["llamacpp_server"].samples] == [
        {"exported_model": "/m/alpha.gguf", "build": "b1", "model": "alpha"},
        {"exported_model": "/m/beta.gguf", "build": "b1", "model": "beta"},
    ]
    assert [(s.labels, s.value) for s in by_name["llamacpp_slot_tokens"].samples] == [
        ({"slot": "0", "model": "alpha"}, 5),
        ({"slot": "0", "model": "beta"}, 7),
    ]
    assert [(s.labels, s.value) for s in by_name["llamacpp_host_memory_available_bytes"].samples] == [({}, 1)]


def _server(tmp_path: Path, name: str, pid: int, nvml: NvmlReader | None, owner: LiveSources | None) -> FollowedServer:
    log = tmp_path / f"{name}.log"
    log.write_bytes(CAPTURE.read_bytes())
    pipeline = LogPipeline(ServerState(), LogTailer(log))
    pipeline.replay_existing()
    live = LiveSources(pipeline.state, nvml=nvml)
    cmdline = parse_command_line(["llama-server", "-c", "512"], {})
    live.proc = ProcSnapshot(process=ProcessInfo(pid, 1, None, 1 << 30, cmdline, "pid"))  # as a /proc read found it
    return FollowedServer({"server": name}, pipeline, live, nvml_owner=owner)


def test_two_servers_sharing_a_gpu_are_visible(tmp_path: Path) -> None:
    """gpu0 holds both servers (a: 100, b: 200), gpu1 only b (how much, NVML cannot tell: a MIG or vGPU
    device); NVML is read once for both."""
    fake = FakeNvml([h200(0, 100, [(100, 40 * GIB), (200, 50 * GIB)]), h200(1, 60, [(200, None)])])
    a = _server(tmp_path, "a", 100, NvmlReader(fake), None)
    b = _server(tmp_path, "b", 200, None, a.live)
    collector = ServersCollector([a, b])
    asyncio.run(refresh_all([a, b]))
    registry = CollectorRegistry(auto_describe=True)
    registry.register(collector)
    get = registry.get_sample_value
    gpu0 = {"gpu": "0", "uuid": fake.gpus[0].uuid}
    gpu1 = {"gpu": "1", "uuid": fake.gpus[1].uuid}
    assert get("llamacpp_gpu_servers", {**gpu0, "name": "NVIDIA H200"}) == 2
    assert get("llamacpp_gpu_servers", {**gpu1, "name": "NVIDIA H200"}) == 1
    assert get("llamacpp_process_gpu_memory_bytes", {**gpu0, "server": "a"}) == 40 * GIB
    assert get("llamacpp_process_gpu_memory_bytes", {**gpu0, "server": "b"}) == 50 * GIB
    assert get("llamacpp_process_gpu_memory_bytes", {**gpu1, "server": "b"}) is None  # there, size unknown
    assert get("llamacpp_process_gpu_memory_bytes", {**gpu1, "server": "a"}) == 0  # not on gpu1's list
    text = generate_latest(registry).decode()
    free = [
        s for f in text_string_to_metric_families(text) if f.name == "llamacpp_gpu_memory_free_bytes" for s in f.samples
    ]
    assert [s.labels for s in free] == [{**gpu0, "name": "NVIDIA H200"}, {**gpu1, "name": "NVIDIA H200"}]
    assert fake.init_calls == 1
    # Every per-server series of the capture, once per server.
    assert get("llamacpp_context_exceeded_total", {"server": "a"}) == 0  # replayed: not counted
    assert get("llamacpp_slots", {"server": "a"}) == get("llamacpp_slots", {"server": "b"}) == 4
    assert 'llamacpp_exporter_source_up{server="b",source="log"} 1.0' in text
    assert 'llamacpp_exporter_source_up{server="a",source="nvml"} 1.0' in text


def test_one_server_exports_exactly_what_it_always_did(tmp_path: Path) -> None:
    """No labels, and the families of the single-server collectors in their order (the golden files' test),
    NVML on: nothing added about GPU sharing."""
    fake = FakeNvml([h200(0, 100, [(100, 40 * GIB)])])
    server = _server(tmp_path, "x", 100, NvmlReader(fake), None)
    one = FollowedServer({}, server.pipeline, server.live)
    collector = ServersCollector([one])
    asyncio.run(refresh_all([one]))
    registry = CollectorRegistry(auto_describe=True)
    registry.register(collector)
    text = generate_latest(registry).decode()
    assert "server=" not in text and "exported_model" not in text and "gpu_servers" not in text
    assert 'llamacpp_process_gpu_memory_bytes{gpu="0"' in text
    direct = CollectorRegistry(auto_describe=True)
    for c in one._own:
        direct.register(c)
    assert text == generate_latest(direct).decode()


def test_each_unit_makes_one_view_a_scrape_that_every_collector_renders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two servers, NVML on: the log state is merged with the live reads once per unit and scrape (in the refresh),
    not once per collector; a render without a refresh makes a new view, so it never shows an older scrape's."""
    merged: list[ServerState] = []
    real = merge_view

    def counted(state: ServerState, http: HttpSnapshot | None) -> ServerState:
        merged.append(state)
        return real(state, http)

    monkeypatch.setattr(unit_mod, "merge_view", counted)
    fake = FakeNvml([h200(0, 100, [(100, 40 * GIB)])])
    a = _server(tmp_path, "a", 100, NvmlReader(fake), None)
    b = _server(tmp_path, "b", 200, None, a.live)
    registry = CollectorRegistry()
    registry.register(ServersCollector([a, b]))
    for _ in range(3):
        asyncio.run(refresh_all([a, b]))
        generate_latest(registry)
    assert sorted(id(st) for st in merged) == sorted([id(a.pipeline.state), id(b.pipeline.state)] * 3)
    starts = registry.get_sample_value("llamacpp_server_starts_total", {"server": "a"})
    a.pipeline.state.server_starts += 1  # as a start would count it, between two scrapes
    assert registry.get_sample_value("llamacpp_server_starts_total", {"server": "a"}) == (starts or 0) + 1


async def test_a_scrape_counts_the_lines_written_before_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scrape's refresh reads the log first: lines written while the follower waits between batches
    (here 5 s) are on /metrics at the next scrape, not at the end of the wait."""
    monkeypatch.setattr(follow_mod, "BATCH_START", 5.0)
    log = tmp_path / "server.log"
    log.write_bytes(CAPTURE.read_bytes())
    # The follower's clock stands still: its 5 s batch wait (and the scrape's own timeout) never ends by itself.
    pipeline = LogPipeline(
        ServerState(), FileSource(LogTailer(log), poll_interval=60, batch_interval=30, clock=ManualClock())
    )
    pipeline.replay_existing()
    server = FollowedServer({}, pipeline, LiveSources(pipeline.state))
    collector = ServersCollector([server])
    registry = CollectorRegistry()
    registry.register(collector)
    stop = asyncio.Event()
    task = asyncio.create_task(pipeline.run(stop=stop))

    async def lines_after(n: int) -> None:
        with log.open("a") as f:
            f.write("".join(f"0.01.000.000 I line {i}\n" for i in range(n)))
        await asyncio.sleep(0)

    def scraped() -> float:
        families = text_string_to_metric_families(generate_latest(registry).decode())
        return next(f.samples[0].value for f in families if f.name == "llamacpp_exporter_log_lines")

    await lines_after(1)
    await wait_until(lambda: pipeline.lines == 1, "the first line, read at once (the follower was idle)")
    await lines_after(1)  # soon after: busy, and this read is followed by the 5 s batch wait
    await wait_until(lambda: pipeline.lines == 2, "the second line")
    await lines_after(40)
    await asyncio.wait_for(refresh_all([server]), HANG_GUARD)  # what the web app runs before it renders /metrics
    assert scraped() == 42  # the clock stood still: the scrape had them read
    stop.set()
    await asyncio.wait_for(task, HANG_GUARD)


GOOD = """
servers:
  - name: gpu0
    log_file: /var/log/llama/gpu0.log
    url: http://127.0.0.1:8080
    pid_file: /run/llama/gpu0.pid
  - name: gpu1
    log_file: /var/log/llama/gpu1.log
    pid: 1234
"""


def test_servers_file() -> None:
    a, b = parse_servers(GOOD)
    assert (a.name, a.log_file, a.url, a.pid, a.pid_file) == (
        "gpu0",
        "/var/log/llama/gpu0.log",
        "http://127.0.0.1:8080",
        None,
        "/run/llama/gpu0.pid",
    )
    assert (b.name, b.url, b.pid) == ("gpu1", None, 1234)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("servers: [", "not YAML"),
        ("- a", "expected one top-level key, servers"),
        ("servers: []", "at least one server"),
        ("servers:\n  - log_file: a", "server 1: name is required"),
        ("servers:\n  - name: 'a b'\n    log_file: a", "letters, digits"),
        ("servers:\n  - name: a\n    log_file: x\n  - name: a\n    log_file: y", "the name is used twice"),
        ("servers:\n  - name: a\n    log_file: x\n  - name: b\n    log_file: x", "followed twice"),
        ("servers:\n  - name: a", "log_file is required"),
        ("servers:\n  - name: a\n    log_file: x\n    pid: -1", "positive whole number"),
        ("servers:\n  - name: a\n    log_file: x\n    pid: 1\n    pid_file: p", "give one of them"),
        ("servers:\n  - name: a\n    log_file: x\n    port: 1", "unknown key 'port'"),
        ("servers:\n  - name: a\n    log_file: 7", "log_file must be a non-empty string"),
        ("servers:\n" + "".join(f"  - {{name: s{i}, log_file: l{i}}}\n" for i in range(MAX_SERVERS + 1)), "at most 64"),
    ],
)
def test_servers_file_errors_name_the_entry(text: str, message: str) -> None:
    with pytest.raises(ServersFileError, match=message):
        parse_servers(text)
