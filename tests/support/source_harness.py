"""Helpers for the log-source tests (standard input, the systemd journal): exporter processes with any
source, a private real systemd-journald, and metric comparison between two exporters.

Plain helpers like ``llama_harness``; every process is started here and signalled only by its own pid.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from llama_harness import ExporterProcess, free_port, http_request, tail_text, wait_for
from paths import B11434
from prometheus_client.parser import text_string_to_metric_families

FIXTURES = B11434
#: The real llama-server b11434 captures (`<name>/llama-server.log`), in a fixed order: those copied from
#: the project's captures, not the build corpus' (with a capture.json; tests/unit/test_build_corpus.py reads
#: those), so that every source reads the same 5,000-odd lines (a private journald's rate limit allows them).
CAPTURES = sorted(p for p in FIXTURES.glob("*/llama-server.log") if not (p.parent / "capture.json").exists())

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


#: Families read live at scrape time (NVML, /proc, the host, llama-server's HTTP endpoints), not from the
#: log: two exporters may see different values for them (host memory moves; only a file source can
#: find llama-server's pid through its open log file), so log comparisons leave them out.
LIVE_PREFIXES = (
    "llamacpp_exporter_",
    "llamacpp_up",
    "llamacpp_server_loading",
    "llamacpp_host_memory_",
    "llamacpp_gpu_",
    "llamacpp_process_",
    # Not a live read, but what the scrapes saw as well as the lines: a slot counts as active from a scrape
    # that saw it process or its turns move (exporter.model.activity), so two exporters fed the same lines and
    # scraped at other moments (a file read whole at a scrape, a journal's lines arriving over a second) differ.
    "llamacpp_kv_pool_active_",
)
#: Exporter flags for comparisons: no llama-server answers HTTP here, so slot tokens come from the log only.
NO_HTTP_SERVER = ("--server-url", "http://127.0.0.1:1")


def server_samples(text: str) -> Samples:
    """Every ``llamacpp_*`` sample of a scrape that comes from the log (not the exporter's own, not live reads).

    These are what the log says about llama-server, so two exporters fed the same lines must agree
    on every one of them, whatever their source.
    """
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("llamacpp_") and not s.name.startswith(LIVE_PREFIXES):
                out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


def split_samples(text: str) -> tuple[Samples, Samples]:
    """`server_samples` split into (gauges, cumulative samples: counters, histograms, summaries).

    Cumulative samples count what happened while the exporter ran; gauges describe the server now.
    """
    gauges: Samples = {}
    cumulative: Samples = {}
    for family in text_string_to_metric_families(text):
        target = cumulative if family.type in ("counter", "histogram", "gaugehistogram", "summary") else gauges
        for s in family.samples:
            if s.name.startswith("llamacpp_") and not s.name.startswith(LIVE_PREFIXES):
                target[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return gauges, cumulative


def sample(text: str, name: str, labels: Mapping[str, str] | None = None) -> float | None:
    """Value of one sample in a scrape (None when absent)."""
    want = dict(labels or {})
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in want.items()):
                return float(s.value)
    return None


def describe_difference(a: Samples, b: Samples, names: tuple[str, str] = ("a", "b")) -> str:
    """Human-readable list of the samples that differ (for assertion messages)."""
    lines = []
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            lines.append(f"  {key[0]}{dict(key[1])}: {names[0]}={a.get(key)} {names[1]}={b.get(key)}")
    return "\n".join(lines) or "  (no difference)"


def wait_lines(exporter: ExporterProcess, n: int, what: str) -> None:
    """Wait until the exporter has read exactly ``n`` live lines (`llamacpp_exporter_log_lines_total`)."""
    wait_for(
        lambda: exporter.sample("llamacpp_exporter_log_lines_total") == n,
        timeout=30,
        what=f"{what} exporter at {n} lines",
    )


def count_lines(data: bytes) -> int:
    """Lines in ``data`` as a line reader sees them (a last line without newline counts)."""
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


class SourceExporter(ExporterProcess):
    """The exporter as a real process with any source flags (``args``), and optionally a given stdin.

    ``stdin=subprocess.PIPE`` gives ``self.stdin`` to write to; a file descriptor or file object is
    passed through (a pipe's read end, a regular file).
    """

    def __init__(
        self,
        args: Sequence[str],
        *,
        workdir: Path,
        name: str,
        stdin: int | IO[Any] | None = None,
        env: Mapping[str, str] | None = None,
        ready_timeout: float = 30.0,
    ) -> None:
        super().__init__(
            workdir / f"{name}.unused",
            [*args, *NO_HTTP_SERVER],
            output_file=workdir / f"exporter-{name}.out",
            ready_timeout=ready_timeout,
            env=env,
        )
        if stdin is not None:
            self._stdin_spec = stdin

    @property
    def command(self) -> list[str]:
        return [sys.executable, "-m", "exporter", "--listen-address", f"127.0.0.1:{self.port}", *self.extra]

    def start(self) -> SourceExporter:
        super().start()
        return self

    def __enter__(self) -> SourceExporter:
        return self.start()

    def stop(self) -> None:
        if self.stdin is not None and not self.stdin.closed:
            self.stdin.close()
        super().stop()

    def output(self) -> str:
        return tail_text(self.output_file, 200)


def find_journald() -> Path | None:
    """The systemd-journald binary (Debian: package systemd), or None."""
    for candidate in ("/lib/systemd/systemd-journald", "/usr/lib/systemd/systemd-journald"):
        p = Path(candidate)
        if p.is_file() and os.access(p, os.X_OK):
            return p
    return None


# What systemd does for a service with StandardOutput=journal: connect to journald's stdout stream
# socket, send the stream header (identifier, unit, priority, level prefix, forward to syslog/kmsg/
# console), make the socket the process's stdout and stderr, and exec the program. journald takes
# _PID from the connecting process (the program itself, after exec) and _SYSTEMD_UNIT from the
# header's unit field, exactly as for a real unit.
_STREAM_WRAPPER = r"""
import os, socket, sys
path, ident, unit = sys.argv[1:4]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(path)
s.sendall(f"{ident}\n{unit}\n6\n1\n0\n0\n0\n".encode())
s.shutdown(socket.SHUT_RD)
os.dup2(s.fileno(), 1)
os.dup2(s.fileno(), 2)
s.close()
os.execvp(sys.argv[4], sys.argv[4:])
"""


class PrivateJournald:
    """A real systemd-journald in its own journal namespace, started by the test (needs root).

    A namespaced journald (``systemd-journald NAME``) listens on ``/run/systemd/journal.NAME/`` and
    stores ``<machine-id>.NAME`` journals; it touches nothing of the machine's own journal, and
    ``journalctl --namespace=NAME`` reads it. Everything it created is removed on exit.
    """

    def __init__(self, binary: Path, workdir: Path) -> None:
        self.binary = binary
        self.namespace = f"lcxtest{os.getpid()}x{uuid.uuid4().hex[:8]}"
        self.socket_dir = Path(f"/run/systemd/journal.{self.namespace}")
        self.stdout_socket = self.socket_dir / "stdout"
        self.output_file = workdir / f"journald-{self.namespace}.out"
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> PrivateJournald:
        with self.output_file.open("ab") as out:
            self._proc = subprocess.Popen(
                [str(self.binary), self.namespace], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )
        proc = self._proc

        def listening() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"systemd-journald exited (rc={proc.returncode}):\n{tail_text(self.output_file)}")
            if not self.stdout_socket.exists():
                return False
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                try:
                    s.connect(str(self.stdout_socket))
                except OSError:
                    return False
            return True

        try:
            wait_for(listening, timeout=30, what="systemd-journald to listen")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def stream_command(self, unit: str, argv: Sequence[str], identifier: str = "llama-server") -> list[str]:
        """argv that runs ``argv`` with its stdout and stderr in this journal as unit ``unit``."""
        return [sys.executable, "-c", _STREAM_WRAPPER, str(self.stdout_socket), identifier, unit, *argv]

    def write(self, unit: str, data_file: Path) -> None:
        """Log the lines of ``data_file`` as one process of ``unit`` (like a service that printed them)."""
        subprocess.run(self.stream_command(unit, ["cat", str(data_file)]), check=True, timeout=60)

    def why_a_writer_died(self, unit: str, name: str, rc: int | None, stderr_file: Path | None = None) -> str:
        """Which component died and why, for a process writing into this journal that exited: itself (its
        stderr before it reached the journal, and its unit's last journal lines) or journald under it."""
        parts = [f"{name} (writing into the private journal as {unit}) exited rc={rc}"]
        if stderr_file is not None and stderr_file.exists() and stderr_file.stat().st_size:
            parts.append(f"its stderr before the journal took over:\n{tail_text(stderr_file)}")
        if self._proc is not None and self._proc.poll() is not None:
            parts.append(
                f"systemd-journald {self.namespace} had died (rc={self._proc.returncode}): that is the cause;"
                f" its output:\n{tail_text(self.output_file)}"
            )
        else:
            parts.append(f"systemd-journald {self.namespace} is running; {unit}'s last journal lines:")
            parts.append("\n".join(self.journalctl("-u", unit, "-o", "cat").splitlines()[-30:]) or "(none)")
        return "\n".join(parts)

    def journalctl(self, *args: str) -> str:
        """Run journalctl on this namespace (for checks and failure messages)."""
        result = subprocess.run(
            ["journalctl", "--no-pager", "--quiet", f"--namespace={self.namespace}", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return result.stdout

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)
        machine_id = Path("/etc/machine-id").read_text().strip() if Path("/etc/machine-id").exists() else "*"
        shutil.rmtree(self.socket_dir, ignore_errors=True)
        for root in (Path("/var/log/journal"), Path("/run/log/journal")):
            for d in root.glob(f"{machine_id}.{self.namespace}"):
                shutil.rmtree(d, ignore_errors=True)


class RenderedLlamaServer:
    """The real llama-server started with an argv and environment rendered from a deployment file
    (paths already mapped to this machine), on a free local port. A context manager."""

    def __init__(self, binary: Path, argv: Sequence[str], env: Mapping[str, str], out_file: Path) -> None:
        self.port = free_port()
        args = list(argv)
        for flag, value in (("--port", str(self.port)), ("--host", "127.0.0.1")):
            if flag in args:
                args[args.index(flag) + 1] = value
            else:
                args += [flag, value]
        self.command = [str(binary), *args]
        base = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_")}
        self.env = {**base, "OMP_WAIT_POLICY": "passive", **env}
        self.out_file = out_file
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> RenderedLlamaServer:
        with self.out_file.open("wb") as sink:
            self._proc = subprocess.Popen(
                self.command, stdin=subprocess.DEVNULL, stdout=sink, stderr=sink, env=self.env
            )
        proc = self._proc

        def healthy() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"llama-server exited rc={proc.returncode}: {' '.join(self.command)}\n{tail_text(self.out_file)}"
                )
            try:
                return http_request(self.url + "/health", timeout=2)[0] == 200
            except OSError:
                return False

        try:
            wait_for(healthy, timeout=60, what="llama-server /health 200")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(30)
