"""The harness against the real llama-server b11434: the scenarios the exporter is built around.

These double as executable documentation of llama-server behaviour the exporter relies on:
the retry cascade and its HTTP 500s, which start-up lines reveal the KV pool size at which
verbosity, ``--log-file`` truncation on restart, and router mode (``--models-dir``): models loaded
and unloaded on demand, each by a child llama-server.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from llama_harness import LlamaRouter, LlamaServer, run_concurrent_completions, wait_for, write_router_models
from tiny_gguf import SLOW_LOAD_SERVER_ARGS, write_slow_loading_model

pytestmark = pytest.mark.llama_server

CASCADE_ARGS = ["-c", "512", "-np", "4", "-kvu", "-lv", "4", "--metrics", "-t", "2"]
# Same 4 slots, but the pool is sized from the per-slot limit: 4 x 512 = 2048 cells.
PER_SLOT_ARGS = ["-np", "4", "-kvu", "--kv-unified-per-slot", "512", "--metrics", "-t", "2"]
EXCEEDED = "Context size has been exceeded."
BANNER = "srv  llama_server: initializing ..."

# Start-up lines that can reveal the shared KV pool size.
POOL_LINES = {
    "n_ctx": re.compile(r"llama_context: n_ctx\s+= (\d+)"),
    "kv_size": re.compile(r"llama_kv_cache: size = .*\(\s*(\d+) cells"),
    "capping": re.compile(r"capping per-slot context \((\d+)\) to --kv-unified-per-slot \((\d+)\)"),
    "init": re.compile(r"initializing, n_slots = (\d+), n_ctx_slot = (\d+), kv_unified = '(\w+)'"),
    "new_slot": re.compile(r"new slot, n_ctx = (\d+)"),
}


def _pool_lines(server: LlamaServer) -> dict[str, list[tuple[str, ...]]]:
    """For each POOL_LINES key, the captured groups of every matching log line."""
    found: dict[str, list[tuple[str, ...]]] = {k: [] for k in POOL_LINES}
    for line in server.log_lines():
        for key, rx in POOL_LINES.items():
            m = rx.search(line)
            if m:
                found[key].append(m.groups())
    return found


def test_cascade_all_four_get_500(llama_server_bin: Path, tiny_llama_model: Path, tmp_path: Path) -> None:
    with LlamaServer(llama_server_bin, tiny_llama_model, CASCADE_ARGS, log_file=tmp_path / "ls.log") as srv:
        results = run_concurrent_completions(srv.url, 4, prompt_chars=100, n_predict=400, timeout=30)
        assert [status for status, _ in results] == [500] * 4, results
        assert all(body["error"]["message"] == EXCEEDED for _, body in results), results
        # The HTTP answers can overtake the log lines (the logger writes from its own thread).
        # `decode() failed` is logged once, after every send_error of the cascade.
        wait_for(lambda: srv.log_lines("decode() failed: " + EXCEEDED), timeout=5, what="decode() failed")
        errors = srv.log_lines("send_error")
        assert len(errors) == 4, errors
        assert all(EXCEEDED in line for line in errors)
        assert len(srv.log_lines("retrying with smaller batch size")) >= 1
        assert len(srv.log_lines("decode() failed: " + EXCEEDED)) == 1
        # The server recovers: the next request on the emptied pool succeeds.
        status, body = run_concurrent_completions(srv.url, 1, prompt_chars=30, n_predict=8)[0]
        assert status == 200, body


def test_per_slot_pool_avoids_the_cascade(llama_server_bin: Path, tiny_llama_model: Path, tmp_path: Path) -> None:
    args = [*PER_SLOT_ARGS, "-lv", "4"]
    with LlamaServer(llama_server_bin, tiny_llama_model, args, log_file=tmp_path / "ls.log") as srv:
        results = run_concurrent_completions(srv.url, 4, prompt_chars=100, n_predict=400, timeout=30)
        assert [status for status, _ in results] == [200] * 4, results
        assert all(body["tokens_predicted"] == 400 for _, body in results)
        assert srv.log_lines("send_error") == []
        assert srv.log_lines("retrying with smaller batch size") == []
        lines = _pool_lines(srv)
    # At -lv 4 the pool size (4 x 512) is stated outright by the library lines...
    assert lines["n_ctx"] == [("2048",)]
    assert lines["kv_size"] == [("2048",)]
    # ...and by the server's capping line; the slot lines only give the per-slot limit.
    assert lines["capping"] == [("2048", "512")]
    assert lines["init"] == [("4", "512", "true")]
    assert lines["new_slot"] == [("512",)] * 4


def test_per_slot_pool_at_default_verbosity(llama_server_bin: Path, tiny_llama_model: Path, tmp_path: Path) -> None:
    with LlamaServer(llama_server_bin, tiny_llama_model, PER_SLOT_ARGS, log_file=tmp_path / "ls.log") as srv:
        lines = _pool_lines(srv)
    # Default -lv 3 hides libllama INFO (n_ctx, kv cache size) and the per-slot "new slot" lines;
    # only the server's capping line still carries the pool size.
    assert lines["n_ctx"] == lines["kv_size"] == lines["new_slot"] == []
    assert lines["capping"] == [("2048", "512")]
    assert lines["init"] == [("4", "512", "true")]


def test_kill9_and_restart_truncate_the_log_file(
    llama_server_bin: Path, tiny_llama_model: Path, tmp_path: Path
) -> None:
    log = tmp_path / "ls.log"
    with LlamaServer(llama_server_bin, tiny_llama_model, CASCADE_ARGS, log_file=log) as srv:
        run_concurrent_completions(srv.url, 4, prompt_chars=100, n_predict=400)
        wait_for(lambda: srv.log_lines("decode() failed"), timeout=5, what="the end of the cascade")
        before = log.stat()
        old_pid = srv.pid
        srv.kill9()
        assert log.stat().st_size == before.st_size  # SIGKILL: no shutdown lines appended
        srv.restart()
        assert srv.pid != old_pid
        after = log.stat()
        # fopen(path, "w"): the same file (inode) truncated, not replaced, and it starts over.
        assert after.st_ino == before.st_ino
        assert after.st_size < before.st_size
        lines = srv.log_lines()
        assert BANNER in lines[0]
        assert len(srv.log_lines(BANNER)) == 1
        assert srv.log_lines("send_error") == []


def test_health_reports_loading_model(llama_server_bin: Path, tmp_path: Path) -> None:
    model = write_slow_loading_model(tmp_path / "slow.gguf", size_mib=1024)
    try:
        srv = LlamaServer(llama_server_bin, model, [*SLOW_LOAD_SERVER_ARGS, "-c", "512", "-t", "2"], wait_ready=False)
        with srv:
            # The HTTP server answers before the weights are read: 503 until the model is loaded.
            def not_ready() -> tuple[int, dict[str, Any]] | None:
                h = srv.health()
                return h if h is not None and h[0] != 200 else None

            status, body = wait_for(not_ready, timeout=10, what="/health answering while loading")
            assert (status, body["error"]["message"]) == (503, "Loading model"), body
            srv.wait_healthy()
            # llama-server's log is written by a thread of its own: the line may reach the file after /health
            # says 200, so it is waited for (a hang guard, not a margin).
            wait_for(lambda: srv.log_lines("model loaded"), timeout=30, what="the 'model loaded' line in the log")
    finally:
        model.unlink()  # 1 GiB: do not leave it in pytest's kept temp dirs


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_router_loads_unloads_and_autoload_false(llama_server_bin: Path, tmp_path: Path) -> None:
    write_router_models(tmp_path / "models", ["alpha", "beta"])
    router = LlamaRouter(llama_server_bin, tmp_path / "models", log_file=tmp_path / "router.log")
    with router:
        assert router.models() == {"alpha": "unloaded", "beta": "unloaded"}
        alpha_pid = router.load("alpha")  # POST /models/load
        status, body = router.complete("beta", "Hello there")  # a request naming beta loads it
        assert status == 200, body
        assert router.models() == {"alpha": "loaded", "beta": "loaded"}
        beta_pid = router.child_pid("beta")
        assert beta_pid is not None
        assert router.children() == {alpha_pid: "alpha", beta_pid: "beta"}
        # The port in /models' args is the one the router's spawn line names.
        for name in ("alpha", "beta"):
            port = router.child_port(name)
            assert router.log_lines(f"spawning server instance with name={name} on port {port}")
            assert router.log_lines(f"[{port}] ")  # the child's own lines, prefixed with its port
        # The flags after --models-dir reach each child (long names); --log-file does not.
        args = router.model_entries()["alpha"]["status"]["args"]
        argv = " ".join(args)
        for part in ("--ctx-size 1024 ", "--kv-unified ", "--parallel 2", "--alias alpha ", "--log-prefix "):
            assert part in argv, args
        assert "--log-file" not in args
        assert Path(f"/proc/{alpha_pid}/cmdline").read_bytes().split(b"\0")[:-1] == [a.encode() for a in args]

        status, slots = router.slots("alpha")
        assert status == 200, slots
        assert [s["n_ctx"] for s in slots] == [1024, 1024]

        router.unload("beta")
        assert router.models() == {"alpha": "loaded", "beta": "unloaded"}
        assert router.child_pid("beta") is None
        assert router.child_port("beta") is None
        wait_for(lambda: router.log_lines("instance name=beta exited with status 0"), 5, what="beta's exit line")
        assert router.log_lines("unload: stopping model instance name=beta")

        # autoload=false answers without loading...
        status, body = router.slots("beta")
        assert (status, body["error"]["message"]) == (400, "model is not loaded"), body
        assert router.models() == {"alpha": "loaded", "beta": "unloaded"}
        assert len(router.log_lines("spawning server instance with name=beta")) == 1
        # ...while a plain GET /slots?model=beta loads beta to answer.
        status, slots = router.proxy_get("/slots", "beta", autoload=True)
        assert status == 200, slots
        assert router.models()["beta"] == "loaded"
        assert len(router.log_lines("spawning server instance with name=beta")) == 2
        children = list(router.children())
    # SIGTERM: the router stops its children itself, and none is left.
    assert router.leftover_children == []
    assert not any(_alive(pid) for pid in children)
    assert len(router.log_lines("unload_all: stopping model instance")) == 2


def test_router_reports_a_killed_child_as_status_1(llama_server_bin: Path, tmp_path: Path) -> None:
    write_router_models(tmp_path / "models", ["alpha"])
    with LlamaRouter(llama_server_bin, tmp_path / "models", log_file=tmp_path / "router.log") as router:
        router.load("alpha")
        router.kill9_child("alpha")
        line = wait_for(lambda: router.log_lines("instance name=alpha exited with status"), 10, what="exit line")
        # b11434 reports a child killed by a signal as exit status 1 (EXIT_FAILURE), like a plain exit(1).
        assert line[0].endswith("run: instance name=alpha exited with status 1"), line
        router.wait_status("alpha", "unloaded", 5)
        status = router.model_entries()["alpha"]["status"]
        assert (status.get("exit_code"), status.get("failed")) == (1, True), status
        assert router.child_pid("alpha") is None
        # Nothing reloads it until a request names it; one that does brings it back.
        assert router.models() == {"alpha": "unloaded"}
        code, body = router.complete("alpha")
        assert code == 200, body
        assert "failed" not in router.model_entries()["alpha"]["status"]
