"""Run the real llama-server as a process: where its binary is, what a server and a router have in common,
and the plain server (``LlamaServer``).

Every process is started here and only ever signalled by its own pid.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from llama_requests import free_port, http_json

#: The llama.cpp build the project pins (scripts/install-llama-server.sh builds it).
LLAMA_BUILD = "11434"


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


def tail_text(path: Path, max_lines: int = 40) -> str:
    """Last ``max_lines`` lines of a text file ('' if it does not exist), for error messages."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return ""
    return "\n".join(lines[-max_lines:])


def stop_process(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """SIGTERM our own child, then SIGKILL it if it has not exited after ``grace`` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(grace)


class LlamaProcess:
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
            stop_process(self._proc)

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


_P = TypeVar("_P", bound=LlamaProcess)


class LlamaServer(LlamaProcess):
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
