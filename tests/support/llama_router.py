"""Run the real llama-server in router mode (``--models-dir``): a router that spawns one child server per
loaded model, the tiny models it lists, and the children seen through /proc.

Every process is started here and only ever signalled by its own pid.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from llama_process import LlamaProcess, stop_process
from llama_requests import http_json, http_request, wait_for

#: Arguments a :class:`LlamaRouter` passes on to every model instance by default: a 1,024-cell pool
#: shared by 2 slots (the router hands every argument after its own on to each child).
ROUTER_CHILD_ARGS = ("-c", "1024", "-np", "2", "-kvu")


def write_router_models(models_dir: Path, names: Sequence[str]) -> list[Path]:
    """Write a tiny llama model ``<name>.gguf`` into ``models_dir`` for each name; return the paths.

    A router started with ``--models-dir models_dir`` lists each file as a model whose id is the
    file's stem. ``tiny_gguf`` (gguf, numpy) is imported here so that importing this module stays light.
    """
    from tiny_gguf import write_tiny_llama

    models_dir.mkdir(parents=True, exist_ok=True)
    return [write_tiny_llama(models_dir / f"{name}.gguf") for name in names]


def _decode_json(raw: bytes) -> Any:
    """``raw`` decoded as JSON, or None when it is not JSON."""
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, start time in clock ticks) of ``pid`` from /proc, or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may itself contain spaces or ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[19])


def _proc_cmdline(pid: int) -> list[str]:
    """argv of ``pid`` from /proc (empty for a zombie or a process that is gone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0")[:-1]]


def _alias_of(argv: Sequence[str]) -> str | None:
    """The value of ``--alias`` in ``argv`` (None without one)."""
    for i, arg in enumerate(argv[:-1]):
        if arg == "--alias":
            return argv[i + 1]
    return None


class LlamaRouter(LlamaProcess):
    """A real llama-server in router mode (``--models-dir``), usable as a context manager.

    Starts ``BIN --models-dir DIR --host 127.0.0.1 --port P --log-file F [--models-max N]
    [--log-prefix --log-timestamps] *child_args`` and (by default) waits for ``/health`` 200. The
    router spawns one child llama-server per loaded model (on demand: a request naming the model,
    ``POST /models/load``, or a ``GET`` such as ``/slots?model=X`` without ``autoload=false``).

    What b11434 does, as seen through this harness:

    * Each child's argv is the router's rendering of its preset: ``BIN --host 127.0.0.1 --log-colors off
      [--log-prefix] [--log-timestamps] --port N --alias NAME --ctx-size 1024 --kv-unified --model
      DIR/NAME.gguf --parallel 2`` (long option names; ``--log-file`` is *not* passed on). ``GET /models``
      shows the same list as ``data[].status.args`` (``--port 0`` while unloaded).
    * A child writes its log to a pipe; the router writes each line into its own ``--log-file``
      prefixed ``[PORT] ``, next to its own lines (``load: spawning server instance with name=alpha on
      port 58071``, ``unload: stopping model instance name=beta``, ``run: instance name=beta exited
      with status 0``).
    * ``POST /models/load`` answers ``{"success": true}`` once the child is spawned, before it is
      loaded; :meth:`load` waits for ``/models`` to say ``loaded``.
    * SIGTERM makes the router stop every child (``unload_all: stopping model instance``) and wait
      for them; a child whose stdin (a pipe from the router) reaches EOF exits by itself, so even a
      SIGKILLed router leaves none behind. :meth:`stop` still checks, and kills any left over by pid.

    Output (stdout and stderr) goes to ``<log_file>.stderr``, appended across restarts.
    """

    WHAT = "llama-server router"

    def __init__(
        self,
        binary: Path,
        models_dir: Path,
        child_args: Sequence[str] = ROUTER_CHILD_ARGS,
        *,
        log_file: Path | None = None,
        models_max: int | None = None,
        log_prefix: bool = True,
        port: int | None = None,
        ready_timeout: float = 30.0,
        wait_ready: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(
            binary,
            log_file=log_file,
            log_name="router.log",
            port=port,
            ready_timeout=ready_timeout,
            wait_ready=wait_ready,
            env=env,
        )
        self.models_dir = models_dir
        self.child_args = list(child_args)
        self.models_max = models_max
        self.log_prefix = log_prefix
        #: Children killed by :meth:`stop` because the router left them running: (pid, alias).
        self.leftover_children: list[tuple[int, str | None]] = []

    @property
    def command(self) -> list[str]:
        """The exact argv this harness runs."""
        cmd = [
            str(self.binary),
            "--models-dir",
            str(self.models_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--log-file",
            str(self.log_file),
        ]
        if self.models_max is not None:
            cmd += ["--models-max", str(self.models_max)]
        if self.log_prefix:
            cmd += ["--log-prefix", "--log-timestamps"]
        return cmd + self.child_args

    # --- the router's API -------------------------------------------------------------------

    def model_entries(self) -> dict[str, dict[str, Any]]:
        """``GET /models``: each ``data[]`` entry by its id (raises on a non-200 answer)."""
        status, raw = http_request(self.url + "/models")
        body = _decode_json(raw)
        if status != 200 or not isinstance(body, dict):
            raise RuntimeError(f"GET /models -> {status}: {raw[:500]!r}")
        return {str(m["id"]): m for m in body.get("data", [])}

    def models(self) -> dict[str, str]:
        """Model id -> ``status.value`` from ``GET /models`` (``loaded``, ``unloaded``, ``loading``...)."""
        return {name: str(m["status"]["value"]) for name, m in self.model_entries().items()}

    def child_port(self, name: str) -> int | None:
        """The port of ``name``'s child, from ``--port N`` in its ``/models`` args (None while unloaded)."""
        entry = self.model_entries().get(name)
        if entry is None:
            raise KeyError(f"the router lists no model {name!r}")
        args = [str(a) for a in entry["status"].get("args", [])]
        for i, arg in enumerate(args[:-1]):
            if arg == "--port":
                port = int(args[i + 1])
                return port if port > 0 and entry["status"]["value"] != "unloaded" else None
        return None

    def children(self) -> dict[int, str | None]:
        """The router's live child processes from /proc: pid -> the value of their ``--alias``."""
        router = self.pid
        found: dict[int, str | None] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            stat = _proc_stat(pid)
            if stat is None or stat[1] != router or stat[0] == "Z":
                continue
            found[pid] = _alias_of(_proc_cmdline(pid))
        return found

    def child_pid(self, name: str) -> int | None:
        """Pid of the child serving ``name`` (a child of the router with ``--alias name``), or None."""
        pids = [pid for pid, alias in self.children().items() if alias == name]
        if len(pids) > 1:
            raise RuntimeError(f"{len(pids)} children of the router have --alias {name}: {pids}")
        return pids[0] if pids else None

    def proxy_get(self, path: str, name: str, *, autoload: bool = False, timeout: float = 10.0) -> tuple[int, Any]:
        """``GET path?model=name&autoload=false`` through the router: (status, decoded JSON).

        ``autoload=False`` by default: without it b11434 *loads* an unloaded model to answer.
        """
        query = urllib.parse.urlencode({"model": name, "autoload": "true" if autoload else "false"})
        status, raw = http_request(f"{self.url}{path}?{query}", timeout=timeout)
        return status, _decode_json(raw)

    def slots(self, name: str) -> tuple[int, Any]:
        """``GET /slots?model=name&autoload=false``: (200, list of slots), or (400, error) when not loaded."""
        return self.proxy_get("/slots", name)

    def complete(
        self, name: str, prompt: str = "Hello", *, n_predict: int = 8, timeout: float = 30.0, **extra: Any
    ) -> tuple[int, dict[str, Any]]:
        """``POST /completion`` naming ``name`` (which loads it if it is not loaded): (status, body)."""
        body = {"model": name, "prompt": prompt, "n_predict": n_predict, **extra}
        return http_json(self.url + "/completion", body=body, timeout=timeout)

    def wait_status(self, name: str, value: str, timeout: float = 30.0) -> None:
        """Poll ``/models`` until ``name``'s status is ``value``."""

        def reached() -> bool:
            self._check_running(f"while waiting for {name} to be {value}")
            return self.models().get(name) == value

        wait_for(reached, timeout, interval=0.05, what=f"model {name} {value}")

    def load(self, name: str, timeout: float = 30.0) -> int:
        """``POST /models/load`` then wait until ``/models`` says loaded; return the child's pid.

        b11434 answers the POST as soon as the child is spawned (and 400 "model is already
        running" when it is loading or loaded), so the wait is ours.
        """
        status, body = http_json(self.url + "/models/load", body={"model": name})
        message = body.get("error", {}).get("message") if isinstance(body.get("error"), dict) else None
        if status != 200 and message != "model is already running":
            raise RuntimeError(f"POST /models/load {name} -> {status}: {body}")
        self.wait_status(name, "loaded", timeout)
        return wait_for(lambda: self.child_pid(name), 5, what=f"the child process of {name}")

    def unload(self, name: str, timeout: float = 30.0) -> None:
        """``POST /models/unload`` then wait until ``/models`` says unloaded."""
        status, body = http_json(self.url + "/models/unload", body={"model": name})
        if status != 200:
            raise RuntimeError(f"POST /models/unload {name} -> {status}: {body}")
        self.wait_status(name, "unloaded", timeout)

    def kill9_child(self, name: str) -> int:
        """SIGKILL the child serving ``name`` (a crash; the router reaps it); return its pid."""
        pid = self.child_pid(name)
        if pid is None:
            raise RuntimeError(f"no child process serves {name}")
        os.kill(pid, signal.SIGKILL)
        return pid

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM the router (it stops its children first), SIGKILL after ``grace`` seconds.

        Children it leaves running (checked by pid and start time, so a reused pid is never
        signalled) are SIGKILLed and recorded in :attr:`leftover_children`.
        """
        if self._proc is None:
            return
        before: dict[int, tuple[int, str | None]] = {}
        if self._proc.poll() is None:
            for pid, alias in self.children().items():
                stat = _proc_stat(pid)
                if stat is not None:
                    before[pid] = (stat[2], alias)
        stop_process(self._proc, grace)
        for pid, (started, alias) in before.items():
            stat = _proc_stat(pid)
            if stat is None or stat[2] != started or stat[0] == "Z":
                continue
            self.leftover_children.append((pid, alias))
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
