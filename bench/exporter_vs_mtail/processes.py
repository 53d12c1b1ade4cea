"""The processes the benchmark starts and measures (CPU and memory from /proc, rusage), its scrapes of
/metrics, and the set-up: mtail, the corpus, the exporter's and mtail's command lines."""

from __future__ import annotations

import contextlib
import functools
import http.client
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


BENCH = REPO / "bench"


MTAIL_PROG = BENCH / "llama.mtail"


CLK_TCK = os.sysconf("SC_CLK_TCK")


def ts(i: int) -> str:
    """A llama-server elapsed timestamp (`min.ss.mmm.uuu`) for the i-th millisecond."""
    return f"{i // 60000}.{i // 1000 % 60:02d}.{i % 1000:03d}.000"


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


class Child:
    """A process this benchmark started; CPU and memory from /proc."""

    def __init__(self, name: str, argv: list[str], workdir: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.errfile = workdir / f"{name}.stderr"
        with self.errfile.open("wb") as err:  # a file, not a pipe: a chatty child must never block on it
            self.popen = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, cwd=REPO, env=env)
        self.pid = self.popen.pid

    def cpu_s(self) -> float:
        """utime + stime of the process (all threads, including those that ended), /proc/<pid>/stat."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def cpu_ns(self) -> int:
        """On-CPU nanoseconds summed over the live threads (/proc/<pid>/task/*/schedstat)."""
        total = 0
        for task in Path(f"/proc/{self.pid}/task").iterdir():
            with contextlib.suppress(OSError):
                total += int((task / "schedstat").read_text().split()[0])
        return total

    def status_kib(self, key: str) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
        return 0

    def stop(self) -> str:
        """SIGTERM, then SIGKILL; returns what the process wrote to stderr (last lines)."""
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        err = self.errfile.read_text(errors="replace")
        return "\n".join(err.strip().splitlines()[-5:])


def run_measured(argv: list[str], stdout_path: Path) -> tuple[float, float, float, int]:
    """Run to completion: (wall s, CPU s, peak RSS MiB, exit status), from the child's own rusage."""
    with stdout_path.open("wb") as out:
        t0 = time.perf_counter()
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.PIPE, cwd=REPO)
        assert p.stderr is not None
        err = p.stderr.read()
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit(f"{argv[0]} failed ({p.returncode}): {err.decode(errors='replace')[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, p.returncode


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Scraper:
    """GET /metrics over one kept-alive connection, like Prometheus."""

    def __init__(self, port: int, authorization: str | None = None) -> None:
        self.port = port
        self.headers = {"Authorization": authorization} if authorization else {}
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)

    def get(self) -> tuple[float, str]:
        """(seconds until the whole body was read, body)."""
        for attempt in range(2):
            t0 = time.perf_counter()
            try:
                self.conn.request("GET", "/metrics", headers=self.headers)
                resp = self.conn.getresponse()
                body = resp.read()
                return time.perf_counter() - t0, body.decode(errors="replace")
            except (OSError, http.client.HTTPException):
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def value(self, name: str) -> float | None:
        return metric_value(self.get()[1], name)

    def close(self) -> None:
        self.conn.close()


def metric_value(body: str, name: str) -> float | None:
    """Sum of the samples of `name` (any labels) in a text exposition; None if absent."""
    values = [float(m[1]) for m in re.finditer(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", body, re.MULTILINE)]
    return sum(values) if values else None


def wait_ready(child: Child, port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child.popen.poll() is not None:
            raise SystemExit(f"{child.name} exited at start: {child.stop()}")
        try:
            Scraper(port).get()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"{child.name} did not answer on port {port} within {timeout:.0f} s")


def wait_until(predicate: Callable[[], bool], timeout: float, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


def find_mtail(install: bool) -> str | None:
    """mtail where scripts/unpack-test-tools.sh unpacks it, else on PATH; with ``install``, unpack it first."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llamacpp-exporter" / "tools"
    tools_bin = Path(os.environ.get("LLAMACPP_EXPORTER_TOOLS") or cache) / "bin"
    unpacked = tools_bin / "mtail"
    if not os.access(unpacked, os.X_OK) and not shutil.which("mtail") and install:
        print("mtail not found: unpacking Debian's mtail package (scripts/unpack-test-tools.sh) ...", flush=True)
        subprocess.run([str(REPO / "scripts" / "unpack-test-tools.sh")], check=False)
    return str(unpacked) if os.access(unpacked, os.X_OK) else shutil.which("mtail")


def make_corpus(workdir: Path, lines: int, seed: int, restart_every: int) -> Path:
    path = workdir / f"corpus-{lines}-{seed}-{restart_every}.log"
    if not path.exists():
        print(f"building {path.name} ...", flush=True)
        tmp = path.with_suffix(".tmp")
        cmd = [sys.executable, str(BENCH / "make_corpus.py"), "--out", str(tmp), "--lines", str(lines)]
        cmd += ["--seed", str(seed), "--restart-every", str(restart_every)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        tmp.rename(path)
    return path


@functools.cache
def exporter_help() -> str:
    argv = [sys.executable, "-m", "exporter", "--help"]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=False).stdout


def exporter_argv(log: Path, port: int, *, nvml: bool = False) -> list[str]:
    argv = [sys.executable, "-m", "exporter", "--log-file", str(log), "--listen-address", f"127.0.0.1:{port}"]
    argv += ["--log-level", "warning"]
    for flag, value in (("--nvml", "on" if nvml else "off"), ("--proc", "off"), ("--http", "off")):
        if flag in exporter_help():  # live sources are off (or idle); older checkouts have no such flags
            argv += [flag, value]
    return argv


def mtail_argv(mtail: str, log: Path, port: int) -> list[str]:
    return [mtail, "--progs", str(MTAIL_PROG), "--logs", str(log), "--address", "127.0.0.1", "--port", str(port)]
