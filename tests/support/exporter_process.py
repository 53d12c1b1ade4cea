"""Run the real exporter as a process (``python -m exporter``) and read its /metrics.

Started here and only ever signalled by its own pid.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from llama_process import stop_process, tail_text
from llama_requests import free_port, http_request, try_http_status
from paths import REPO
from prometheus_client.parser import text_string_to_metric_families


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
                cwd=REPO,
                stdin=self._stdin_spec,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
            )
        self.stdin = self._proc.stdin
        deadline = time.monotonic() + self.ready_timeout
        while try_http_status(self.url + "/") != 200:
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
            stop_process(self._proc)

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
