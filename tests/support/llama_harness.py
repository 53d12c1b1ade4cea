"""Run the real llama-server and the real exporter as processes, for end-to-end tests.

Plain helpers (no pytest dependency) so that tests, benchmarks and ad-hoc scripts can share them.
Every process is started here and only ever signalled by its own pid. The names tests import live in:
``llama_process`` (the binary, a plain server), ``llama_router`` (router mode), ``exporter_process``
(the exporter) and ``llama_requests`` (requests, ports and waits); this module exports them all.
"""

from __future__ import annotations

from exporter_process import ExporterProcess
from llama_process import LLAMA_BUILD, LlamaServer, find_llama_server, tail_text
from llama_requests import free_port, http_json, http_request, make_prompt, run_concurrent_completions, wait_for
from llama_router import ROUTER_CHILD_ARGS, LlamaRouter, write_router_models
from paths import REPO as REPO_ROOT

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
    "tail_text",
    "wait_for",
    "write_router_models",
]
