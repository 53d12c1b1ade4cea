"""A crash's cause named: ggml's own lines (the format strings of the b11434 tree) parsed as events, named in
`diagnose`'s report and JSON, and counted as `llamacpp_server_crashes_total{cause}` when the run ends
without its exit line. The crashes are the real kill -9 captures with a crash's last lines added in the
server's own format, the way b11434 writes them (the log's prefix where its log callback writes them,
none for ggml_abort's own `fprintf(stderr)`), also on Windows (CRLF, PowerShell 5.1's UTF-16)."""

from __future__ import annotations

from pathlib import Path

import pytest
from corpus_replay import CAPTURES, exported, follow
from paths import FIXTURES
from windows_logs import variant

from exporter.diagnose import diagnose_files
from exporter.diagnose.render import render_text, to_json
from exporter.logs import events as ev
from exporter.logs.parse import parse_line
from exporter.model.run import CRASH_CAUSES

CUDA_ABORT = r"D:\a\llama.cpp\llama.cpp\ggml\src\ggml-cuda\ggml-cuda.cu:109: CUDA error"


@pytest.mark.parametrize(
    ("line", "cause"),
    [
        # ggml_cuda_error: GGML_LOG_ERROR(GGML_CUDA_NAME " error: %s\n", msg), for each of CUDA, ROCm, MUSA
        ("0.01.002.003 E CUDA error: out of memory", "cuda_out_of_memory"),
        ("ROCm error: out of memory", "cuda_out_of_memory"),
        # ggml_backend_cuda_buffer_type_alloc_buffer: "%s: allocating %.2f MiB on device %d: cudaMalloc failed: %s\n"
        (
            "0.00.912.000 E ggml_backend_cuda_buffer_type_alloc_buffer: allocating 20480.00 MiB on device 0: "
            "cudaMalloc failed: out of memory",
            "cuda_out_of_memory",
        ),
        # ggml-backend.cpp: "%s: failed to allocate %s buffer of size %zu\n"
        ("alloc_tensor_range: failed to allocate CUDA0 buffer of size 21474836480", "cuda_out_of_memory"),
        ("alloc_tensor_range: failed to allocate Vulkan0 buffer of size 21474836480", "vulkan_out_of_memory"),
        ("alloc_tensor_range: failed to allocate MTL0 buffer of size 21474836480", "metal_out_of_memory"),
        # ggml-metal.cpp: "%s: failed to allocate Metal buffer of %zu bytes (out of memory)\n"
        (
            "ggml_backend_metal_buffer_type_alloc_buffer: failed to allocate Metal buffer of 123456789 bytes "
            "(out of memory)",
            "metal_out_of_memory",
        ),
        # ggml-metal-device.m: "%s: error: failed to allocate buffer, size = %8.2f MiB\n"
        ("ggml_metal_buffer_init: error: failed to allocate buffer, size =  2048.00 MiB", "metal_out_of_memory"),
        # ggml-vulkan-buffers.cpp: std::cerr << "ggml_vulkan: Memory allocation of size " << size << " failed."
        ("ggml_vulkan: Memory allocation of size 4294967296 failed.", "vulkan_out_of_memory"),
        ("terminate called after throwing an instance of 'vk::OutOfDeviceMemoryError'", "vulkan_out_of_memory"),
        # ggml_abort: "%s:%d: " then the message, on stderr without the log's prefix; GGML_ASSERT's message
        (CUDA_ABORT, "ggml_abort"),
        ("/home/runner/work/llama.cpp/ggml/src/ggml.c:3021: GGML_ASSERT(a->ne[2] == b->ne[0]) failed", "ggml_assert"),
        ("/src/llama.cpp/src/llama-context.cpp:1207: fatal error", "ggml_abort"),
        ("[ 8081] /src/ggml/src/ggml.c:12: GGML_ASSERT(ctx) failed", "ggml_assert"),  # a router child's line
    ],
)
def test_each_cause_in_ggmls_words(line: str, cause: str) -> None:
    e = parse_line(line)
    assert isinstance(e, ev.CrashCause) and e.cause == cause, e
    assert e.cause in CRASH_CAUSES and len(e.message) <= 300 and "\n" not in e.message


@pytest.mark.parametrize(
    "path",
    [
        "/src/ggml/src/ggml.c",
        r"D:\a\llama.cpp\ggml\src\ggml-cuda\ggml-cuda.cu",
        "c:\\" + "d" * 299 + ".cpp",  # the longest path read: 300 characters before its extension (after `c:`)
        "/" + "d" * 299 + ".h",
    ],
)
@pytest.mark.parametrize("message", ["GGML_ASSERT(ctx) failed", "fatal error", "y" * 2000])
def test_an_aborts_message_is_its_whole_line(path: str, message: str) -> None:
    """Each form of the abort rule (a path from `/`, or from a drive letter) keeps the line from its first
    character: the last 300 of them."""
    line = f"{path}:12: {message}"
    e = parse_line("0.00.001.000 E " + line if len(message) < 2000 else line)
    assert e == ev.CrashCause("ggml_assert" if message.startswith("GGML_ASSERT(") else "ggml_abort", line[-300:])


@pytest.mark.parametrize(
    "line",
    [
        "srv  update_slots: all slots are idle",
        "/v1/chat/completions: GGML_ASSERT(x) failed",  # not a source file
        "C: drive is full",
        "warning: a CUDA error: out of memory",  # not at the start of the message
        "/src/ggml.c:12: " + "x" * 5000,  # unbounded: not read
        "/" + "d" * 300 + ".h:12: fatal error",  # a path longer than any read
        "c:\\" + "d" * 300 + ".cpp:12: fatal error",
    ],
)
def test_lines_that_only_look_like_a_cause(line: str) -> None:
    e = parse_line(line)
    assert not isinstance(e, ev.CrashCause), e


def _crashed_log(tail: list[str]) -> bytes:
    """The kill -9 capture's first run, ending with a crash's last lines `tail` (a `{t}` in a line is the
    run's time stamp prefix, `E ` level)."""
    first = (FIXTURES / "b11434" / "restart-kill9" / "llama-server.1.log").read_bytes()
    stamp = "0.00.070.000 E "
    return first + "".join(line.replace("{t}", stamp) + "\n" for line in tail).encode()


CUDA_OOM = [
    "{t}CUDA error: out of memory",
    "{t}  current device: 0, in function ggml_cuda_pool_leg::alloc at "
    r"D:\a\llama.cpp\llama.cpp\ggml\src\ggml-cuda\ggml-cuda.cu:497",
    "{t}  cudaDeviceSynchronize()",
    CUDA_ABORT,
]
ASSERT = ["/home/runner/work/llama.cpp/ggml/src/ggml.c:3021: GGML_ASSERT(a->ne[2] == b->ne[0]) failed"]


@pytest.mark.parametrize("kind", ["lf", "crlf", "powershell51"])
@pytest.mark.parametrize(("tail", "cause"), [(CUDA_OOM, "cuda_out_of_memory"), (ASSERT, "ggml_assert"), ([], None)])
def test_a_crash_is_counted_and_named_by_its_cause(
    tmp_path: Path, kind: str, tail: list[str], cause: str | None
) -> None:
    folder = tmp_path / "capture"
    folder.mkdir()
    (folder / "llama-server.1.log").write_bytes(_crashed_log(tail))
    second = FIXTURES / "b11434" / "restart-kill9" / "llama-server.log"
    (folder / "llama-server.log").write_bytes(second.read_bytes())
    for extra in ("capture.json", "slots.json"):
        (folder / extra).write_bytes((FIXTURES / "b11434" / "restart-kill9" / extra).read_bytes())

    state, _ = follow(folder, tmp_path, lambda data: variant(data, kind))
    m = exported(state)
    crashes = {dict(k[1])["cause"]: v for k, v in m.items() if k[0] == "llamacpp_server_crashes_total"}
    assert crashes == {c: (1 if c == (cause or "unknown") else 0) for c in CRASH_CAUSES}
    assert m[("llamacpp_server_starts_total", ())] == 2
    assert not any(v for k, v in m.items() if k[0] == "llamacpp_exporter_log_lines_rejected_total")

    files = []
    for name in ("llama-server.1.log", "llama-server.log"):
        (tmp_path / kind).mkdir(exist_ok=True)
        path = tmp_path / kind / name
        path.write_bytes(variant((folder / name).read_bytes(), kind))
        files.append(str(path))
    report = diagnose_files(files)
    ending = report.runs[0].ending
    assert (ending.how, ending.cause) == ("died_idle", cause)
    assert report.runs[1].ending.cause is None
    if cause == "cuda_out_of_memory":
        assert ending.cause_message == "CUDA error: out of memory"
        assert "Cause: out of GPU memory (CUDA), in the log's words: CUDA error: out of memory" in render_text(report)
        assert '"cause": "cuda_out_of_memory"' in to_json(report)
    elif cause == "ggml_assert":
        assert ending.cause_message is not None and ending.cause_message.endswith(
            "GGML_ASSERT(a->ne[2] == b->ne[0]) failed"
        )


def test_a_cause_without_a_crash_counts_nothing(tmp_path: Path) -> None:
    """A client's forged cause line (a prompt at debug level) in a run that goes on and exits cleanly, or
    that is still running: no crash is counted. Only a run that ends without its exit line is one."""
    from exporter.logs.tail import LogTailer
    from exporter.model.state import ServerState
    from exporter.pipeline import LogPipeline

    log = tmp_path / "llama-server.log"
    first = (FIXTURES / "b11434" / "restart-kill9" / "llama-server.log").read_bytes()
    log.write_bytes(b"")
    state = ServerState()
    tailer = LogTailer(log)
    pipeline = LogPipeline(state, tailer)
    pipeline.replay_existing()
    log.write_bytes(first + (CUDA_ABORT + "\n").encode())
    pipeline.feed(tailer.poll())
    assert sum(state.server_crashes.values()) == 0  # still running
    with log.open("ab") as f:
        f.write(b"0.00.090.000 I srv    operator(): operator(): cleaning up before exit...\n")
    pipeline.feed(tailer.poll())
    log.write_bytes(first)  # the next start
    pipeline.feed(tailer.poll())
    assert state.server_starts == 2 and sum(state.server_crashes.values()) == 0


@pytest.mark.parametrize("folder", [p for p in CAPTURES if p.name == "restart-kill9"], ids=lambda p: p.parent.name)
def test_every_builds_kill9_is_one_crash_of_unknown_cause(folder: Path, tmp_path: Path) -> None:
    state, _ = follow(folder, tmp_path)
    assert dict(state.server_crashes) == {"unknown": 1}
