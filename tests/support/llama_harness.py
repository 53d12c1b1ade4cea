"""Run the real llama-server and the real exporter as processes, for end-to-end tests.

Plain helpers (no pytest dependency) so that tests, benchmarks and ad-hoc scripts can share them.
Every process is started here and only ever signalled by its own pid. The names tests import live in:
``llama_process`` (the binary, a plain server), ``llama_router`` (router mode), ``exporter_process``
(the exporter) and ``llama_requests`` (requests, ports and waits); this module exports them all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from exporter_process import ExporterProcess
from llama_process import LLAMA_BUILD, LlamaServer, find_llama_server, tail_text
from llama_requests import free_port, http_json, http_request, make_prompt, run_concurrent_completions, wait_for
from llama_router import ROUTER_CHILD_ARGS, LlamaRouter, write_router_models
from paths import REPO as REPO_ROOT

if TYPE_CHECKING:
    from pathlib import Path

__all__ = [
    "LLAMA_BUILD",
    "REPO_ROOT",
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
    "start_guarded",
    "tail_text",
    "wait_for",
    "write_router_models",
]


def start_guarded(server: LlamaServer | LlamaRouter, tmp: Path, *extra: str) -> tuple[ExporterProcess, int]:
    """The exporter following `server`, with its guard on a free port in front of it: (exporter, guard port)."""
    port = free_port()
    exporter = ExporterProcess(
        server.log_file,
        ["--server-url", server.url, "--nvml", "off", "--guard.listen-address", f"127.0.0.1:{port}", *extra],
        output_file=tmp / f"exporter-{port}.out",
    ).start()
    return exporter, port
