"""Run the real llama-server and the real exporter as processes, for end-to-end tests.

Plain helpers (no pytest dependency) so that tests, benchmarks and ad-hoc scripts can share them.
Every process is started here and only ever signalled by its own pid.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any, TypeVar

from paths import REPO
from prometheus_client.parser import text_string_to_metric_families

#: The llama.cpp build the project pins (scripts/install-llama-server.sh builds it).
LLAMA_BUILD = "11434"
REPO_ROOT = REPO

_T = TypeVar("_T")


def find_llama_server() -> Path | None:
    """Locate llama-server: ``$LLAMA_SERVER_BIN``, then the install script's cache, then ``$PATH``.

    A set ``$LLAMA_SERVER_BIN`` is the only candidate (None if it is not executable), so a typo
    there never silently tests some other build.

    The cache is ``$LLAMA_SERVER_CACHE`` (default ``~/.cache/llamacpp-exporter``) +
    ``/llama-server-b11434/llama-server``, exactly where scripts/install-llama-server.sh puts it.
    """
    env_bin = os.environ.get("LLAMA_SERVER_BIN")
    if env_bin:
        p = Path(env_bin).expanduser()
        return p if p.is_file() and os.access(p, os.X_OK) else None
    cache = Path(os.environ.get("LLAMA_SERVER_CACHE") or Path.home() / ".cache" / "llamacpp-exporter")
    cached = cache.expanduser() / f"llama-server-b{LLAMA_BUILD}" / "llama-server"
    if cached.is_file() and os.access(cached, os.X_OK):
        return cached
    on_path = shutil.which("llama-server")
    return Path(on_path) if on_path else None


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_for(
    condition: Callable[[], _T | None], timeout: float, *, interval: float = 0.02, what: str = "condition"
) -> _T:
    """Poll ``condition`` until it returns something truthy; return that value.

    Raises ``TimeoutError`` naming ``what`` after ``timeout`` seconds. Tests use this instead of
    fixed sleeps so that they are as fast as the system allows and bounded when it is not.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.1f}s waiting for {what}")
        time.sleep(interval)


def tail_text(path: Path, max_lines: int = 40) -> str:
    """Last ``max_lines`` lines of a text file ('' if it does not exist), for error messages."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return ""
    return "\n".join(lines[-max_lines:])


def http_request(url: str, *, body: Mapping[str, Any] | None = None, timeout: float = 10.0) -> tuple[int, bytes]:
    """GET (or POST JSON when ``body`` is given); return (status, raw body), non-2xx included."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="GET" if body is None else "POST")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as e:  # 4xx/5xx still carry the JSON error body we want
        with e:
            return int(e.code), e.read()


def http_json(url: str, *, body: Mapping[str, Any] | None = None, timeout: float = 10.0) -> tuple[int, dict[str, Any]]:
    """Like :func:`http_request` but decodes a JSON object (``{}`` when the body is not one)."""
    status, raw = http_request(url, body=body, timeout=timeout)
    try:
        decoded = json.loads(raw)
    except ValueError:
        return status, {}
    return status, decoded if isinstance(decoded, dict) else {"_": decoded}


def _try_http_status(url: str, timeout: float = 1.0) -> int | None:
    """Status of GET ``url``, or None while nothing accepts the connection yet."""
    try:
        return http_request(url, timeout=timeout)[0]
    except (OSError, urllib.error.URLError):
        return None


def make_prompt(chars: int) -> str:
    """English-looking prompt of exactly ``chars`` characters (~1 tiny-model token per character)."""
    base = "The quick brown fox jumps over the lazy dog while the server counts every token. "
    return (base * (chars // len(base) + 1))[:chars]


def run_concurrent_completions(
    url: str,
    n: int = 4,
    *,
    prompt_chars: int = 100,
    n_predict: int = 400,
    ignore_eos: bool = True,
    timeout: float = 30.0,
    extra: Mapping[str, Any] | None = None,
) -> list[tuple[int, dict[str, Any]]]:
    """Send ``n`` POST /completion requests at the same instant; return (status, JSON body) each.

    With ``-c 512 -np 4 -kvu`` and the defaults (4 x ~100-token prompts, 400 tokens each, EOS
    ignored) the four sequences outgrow the shared 512-cell pool together: the server runs the
    "retrying with smaller batch size" cascade and answers all four with HTTP 500 "Context size has
    been exceeded." within ~100 ms. A barrier releases the threads together because a request that
    started ~20 ms early could finish alone before the pool fills.
    """
    body: dict[str, Any] = {
        "prompt": make_prompt(prompt_chars),
        "n_predict": n_predict,
        "ignore_eos": ignore_eos,
        "cache_prompt": False,
        **(extra or {}),
    }
    endpoint = url.rstrip("/") + "/completion"
    results: list[tuple[int, dict[str, Any]] | BaseException | None] = [None] * n
    barrier = threading.Barrier(n)

    def worker(i: int) -> None:
        try:
            barrier.wait(timeout)
            results[i] = http_json(endpoint, body=body, timeout=timeout)
        except BaseException as e:  # re-raised in the caller's thread below
            results[i] = e

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    out: list[tuple[int, dict[str, Any]]] = []
    for r in results:
        if isinstance(r, BaseException):
            raise r
        if r is None:
            raise TimeoutError(f"a /completion request did not finish within {timeout}s")
        out.append(r)
    return out


def _stop_process(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """SIGTERM our own child, then SIGKILL it if it has not exited after ``grace`` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(grace)


class _LlamaProcess:
    """What a real llama-server process (a server or a router) and its harness have in common: the
    process started and signalled only by its own pid, its ``--log-file``, ``/health``, and the
    output file ``<log_file>.stderr`` (appended to across restarts). Subclasses give `command`."""

    #: How messages name the process.
    WHAT = "llama-server"

    def __init__(
        self,
        binary: Path,
        *,
        log_file: Path | None,
        log_name: str,
        port: int | None,
        ready_timeout: float,
        wait_ready: bool,
        env: Mapping[str, str] | None,
    ) -> None:
        self.binary = binary
        self.port = port or free_port()
        self.ready_timeout = ready_timeout
        self.wait_ready = wait_ready
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None
        if log_file is None:
            self._tmpdir = tempfile.TemporaryDirectory(prefix="llama-harness-")
            log_file = Path(self._tmpdir.name) / log_name
        self.log_file = log_file
        self.stderr_file = log_file.with_name(log_file.name + ".stderr")
        # Never inherit a caller's LLAMA_ARG_* settings: the command line must fully define the run
        # (a router passes its environment on to every child too).
        base = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
        # The CPU backend is built with OpenMP. With its default (spinning) wait policy, `-t 2` on a
        # 2-core machine that is also running pytest and the exporter stalled single decodes for
        # 2-13 s in ~1 run in 10; passive waiting brought the worst of 40 runs to 0.08 s.
        self.env = {**base, "OMP_WAIT_POLICY": "passive", **(env or {})}
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def command(self) -> list[str]:
        raise NotImplementedError

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:43123``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        """Pid of the running process (raises if it was never started)."""
        if self._proc is None:
            raise RuntimeError(f"{self.WHAT} is not started")
        return self._proc.pid

    def start(self: _P) -> _P:
        """Start the process; wait for ``/health`` 200 unless ``wait_ready`` is False."""
        if self._proc is not None and self._proc.poll() is None:
            raise RuntimeError(f"{self.WHAT} already running (pid {self._proc.pid})")
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with self.stderr_file.open("ab") as err:
            err.write(f"\n=== harness: starting {' '.join(self.command)}\n".encode())
            err.flush()
            # stdout too goes to a file: with no TTY on stdout/stderr `--log-colors auto` stays off.
            self._proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=self.env)
        if self.wait_ready:
            self.wait_healthy()
        return self

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _check_running(self, what: str) -> None:
        if not self.is_running():
            code = None if self._proc is None else self._proc.returncode
            raise RuntimeError(
                f"{self.WHAT} exited (rc={code}) {what}: {' '.join(self.command)}\n"
                f"--- {self.stderr_file} (tail) ---\n{tail_text(self.stderr_file)}"
            )

    def health(self, timeout: float = 2.0) -> tuple[int, dict[str, Any]] | None:
        """(status, body) of GET /health, or None while the port does not accept connections."""
        try:
            return http_json(self.url + "/health", timeout=timeout)
        except (OSError, urllib.error.URLError):
            return None

    def wait_healthy(self, timeout: float | None = None) -> None:
        """Poll ``/health`` until 200; raise with the output tail if the process dies or times out."""
        limit = self.ready_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while True:
            self._check_running("before becoming healthy")
            h = self.health()
            if h is not None and h[0] == 200:
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"{self.WHAT} not healthy after {limit:.0f}s (last /health: {h})\n"
                    f"--- {self.stderr_file} (tail) ---\n{tail_text(self.stderr_file)}"
                )
            time.sleep(0.02)

    def log_text(self) -> str:
        """Current content of the ``--log-file``."""
        try:
            return self.log_file.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_lines(self, needle: str | None = None) -> list[str]:
        """Lines of the ``--log-file``, optionally only those containing ``needle``."""
        lines = self.log_text().splitlines()
        return lines if needle is None else [ln for ln in lines if needle in ln]

    def stop(self) -> None:
        """Terminate cleanly (SIGTERM, then SIGKILL after a grace period)."""
        if self._proc is not None:
            _stop_process(self._proc)

    def __enter__(self: _P) -> _P:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        if self._tmpdir is not None:
            self._tmpdir.cleanup()


_P = TypeVar("_P", bound=_LlamaProcess)


class LlamaServer(_LlamaProcess):
    """A real llama-server child process with a ``--log-file``, usable as a context manager.

    Starts ``BIN -m MODEL --host 127.0.0.1 --port P --log-file F *args`` and (by default) waits for
    ``/health`` to answer 200. Its stdout and stderr go to ``<log_file>.stderr``, which is appended
    to across restarts (the ``--log-file`` itself is truncated by the server at each start), so the
    full history stays available for failure messages.
    """

    def __init__(
        self,
        binary: Path,
        model: Path,
        args: Sequence[str] = (),
        *,
        log_file: Path | None = None,
        port: int | None = None,
        ready_timeout: float = 30.0,
        wait_ready: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(
            binary,
            log_file=log_file,
            log_name="llama-server.log",
            port=port,
            ready_timeout=ready_timeout,
            wait_ready=wait_ready,
            env=env,
        )
        self.model = model
        self.args = list(args)

    @property
    def command(self) -> list[str]:
        """The exact argv this harness runs."""
        return [
            str(self.binary),
            "-m",
            str(self.model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--log-file",
            str(self.log_file),
            *self.args,
        ]

    def kill9(self) -> None:
        """SIGKILL the server (a crash: no shutdown lines), and reap it."""
        if self._proc is not None and self._proc.poll() is None:
            os.kill(self._proc.pid, signal.SIGKILL)
            self._proc.wait(10)

    def restart(self) -> LlamaServer:
        """Stop if running, then start again with the same argv (same port, same --log-file)."""
        self.stop()
        return self.start()


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


class LlamaRouter(_LlamaProcess):
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
        _stop_process(self._proc, grace)
        for pid, (started, alias) in before.items():
            stat = _proc_stat(pid)
            if stat is None or stat[2] != started or stat[0] == "Z":
                continue
            self.leftover_children.append((pid, alias))
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


class ExporterProcess:
    """The exporter as a real process (``python -m exporter``), usable as a context manager.

    Runs ``[sys.executable, "-m", "exporter", "--log-file", F, "--listen-address",
    "127.0.0.1:PORT", *extra]`` from the repository root and waits for ``GET /`` to answer 200.
    Output goes to ``output_file`` (appended across restarts) for failure messages.
    """

    def __init__(
        self,
        log_file: Path,
        extra: Sequence[str] = (),
        *,
        port: int | None = None,
        output_file: Path | None = None,
        ready_timeout: float = 15.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.log_file = log_file
        self.extra = list(extra)
        self.port = port or free_port()
        self.ready_timeout = ready_timeout
        self.output_file = output_file or log_file.with_name(f"exporter-{self.port}.out")
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self._proc: subprocess.Popen[bytes] | None = None
        # What the child reads as stdin; subclasses feed it a pipe (the `--log-file -` source).
        self._stdin_spec: int | IO[Any] = subprocess.DEVNULL
        self.stdin: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("exporter is not started")
        return self._proc.pid

    @property
    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "exporter",
            "--log-file",
            str(self.log_file),
            "--listen-address",
            f"127.0.0.1:{self.port}",
            *self.extra,
        ]

    def start(self) -> ExporterProcess:
        """Start the exporter and wait until ``GET /`` answers 200 (raise with its output if not)."""
        if self._proc is not None and self._proc.poll() is None:
            raise RuntimeError(f"exporter already running (pid {self._proc.pid})")
        with self.output_file.open("ab") as out:
            out.write(f"\n=== harness: starting {' '.join(self.command)}\n".encode())
            out.flush()
            self._proc = subprocess.Popen(
                self.command,
                cwd=REPO_ROOT,
                stdin=self._stdin_spec,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
            )
        self.stdin = self._proc.stdin
        deadline = time.monotonic() + self.ready_timeout
        while _try_http_status(self.url + "/") != 200:
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"exporter exited (rc={self._proc.returncode}): {' '.join(self.command)}\n"
                    f"--- {self.output_file} (tail) ---\n{tail_text(self.output_file)}"
                )
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"exporter did not answer GET / within {self.ready_timeout:.0f}s\n"
                    f"--- {self.output_file} (tail) ---\n{tail_text(self.output_file)}"
                )
            time.sleep(0.02)
        return self

    def scrape(self, timeout: float = 10.0) -> str:
        """GET /metrics as text (raises on a non-200 answer)."""
        status, raw = http_request(self.url + "/metrics", timeout=timeout)
        if status != 200:
            raise RuntimeError(f"GET /metrics -> {status}: {raw[:500]!r}")
        return raw.decode()

    def sample(self, name: str, labels: Mapping[str, str] | None = None) -> float | None:
        """Value of the sample called ``name`` (full sample name, e.g. ``foo_total``) in a fresh scrape.

        ``labels`` must be a subset of the sample's labels. Returns None when nothing matches and
        raises if more than one sample matches, so a test never silently reads the wrong series.
        """
        want = dict(labels or {})
        found: list[float] = []
        for family in text_string_to_metric_families(self.scrape()):
            for s in family.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in want.items()):
                    found.append(float(s.value))
        if len(found) > 1:
            raise ValueError(f"{len(found)} samples match {name}{want}; give more labels")
        return found[0] if found else None

    def stop(self) -> None:
        if self._proc is not None:
            _stop_process(self._proc)

    def restart(self) -> ExporterProcess:
        """Stop (SIGTERM) and start again with the same argv and port."""
        self.stop()
        return self.start()

    def __enter__(self) -> ExporterProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


__all__ = [
    "ROUTER_CHILD_ARGS",
    "ExporterProcess",
    "LlamaRouter",
    "LlamaServer",
    "find_llama_server",
    "free_port",
    "http_json",
    "http_request",
    "make_prompt",
    "run_concurrent_completions",
    "tail_text",
    "wait_for",
    "write_router_models",
]
