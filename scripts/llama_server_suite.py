#!/usr/bin/env python3
"""llama.cpp's own server test suite (`tools/server/tests`), run directly and through the guard; see
scripts/llama-server-suite.sh, which drives it.

Two roles, standard library only:

- **The wrapper** (no arguments but llama-server's; the suite's `LLAMA_SERVER_BIN_PATH`). It points the
  presets' Hugging Face models at a tiny local model (no downloads: `--hf-repo`, `--hf-file`, `--model-url`
  and `--offline` become `--model $SUITE_MODEL`), and writes llama-server's log to a file. With
  `SUITE_MODE=direct` it then becomes llama-server. With `SUITE_MODE=guard` it starts llama-server on a free
  port and the exporter's guard on the test's `--host`/`--port`, so that every request of the test goes
  through the guard; SIGTERM (the suite's stop) ends both.
- **`compare DIRECT.xml GUARD.xml`**: the two runs' JUnit reports side by side, test by test; exit status 1
  when an outcome differs.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

#: llama-server options that fetch a model, with how many values each takes.
_MODEL_SOURCES = {"--hf-repo": 1, "-hf": 1, "-hfr": 1, "--hf-file": 1, "-hff": 1, "--model-url": 1, "-mu": 1}
_DROPPED = {"--offline": 0, "--mmproj-url": 1, "-mmpu": 1}


def _rewrite(args: list[str], model: str) -> list[str]:
    """llama-server's arguments with the model fetches replaced by the local model."""
    out: list[str] = []
    fetched = False
    has_model = False
    i = 0
    while i < len(args):
        a = args[i]
        if a in _MODEL_SOURCES:
            fetched = True
            i += 1 + _MODEL_SOURCES[a]
            continue
        if a in _DROPPED:
            i += 1 + _DROPPED[a]
            continue
        if a in ("--model", "-m"):
            has_model = True
        out.append(a)
        i += 1
    if fetched and not has_model:
        out += ["--model", model]
    return out


def _option(args: list[str], name: str, default: str) -> str:
    for i, a in enumerate(args[:-1]):
        if a == name:
            return args[i + 1]
    return default


def _replace(args: list[str], name: str, value: str) -> list[str]:
    out = list(args)
    for i, a in enumerate(out[:-1]):
        if a == name:
            out[i + 1] = value
            return out
    return [*out, name, value]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _address(host: str, port: int | str) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def wrap(argv: list[str]) -> int:
    real = os.environ["SUITE_LLAMA_SERVER"]
    mode = os.environ.get("SUITE_MODE", "direct")
    work = Path(os.environ.get("SUITE_WORK", "/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    args = _rewrite(argv, os.environ["SUITE_MODEL"])
    tag = f"{os.getpid()}-{time.monotonic_ns()}"
    log = work / f"llama-{tag}.log"
    if "--log-file" not in args:
        args += ["--log-file", str(log)]
    if mode == "direct":
        os.execv(real, [real, *args])
    port = _option(args, "--port", "8080")
    hosts = [h.strip() for h in _option(args, "--host", "127.0.0.1").split(",") if h.strip()]
    inner = _free_port()
    upstream_host = hosts[0]
    server = subprocess.Popen([real, *_replace(_replace(args, "--port", str(inner)), "--host", upstream_host)])
    exporter_cmd = [
        os.environ.get("SUITE_EXPORTER_PYTHON", sys.executable),
        "-m",
        "exporter",
        "--log-file",
        _option(args, "--log-file", str(log)),
        "--server-url",
        f"http://{_address(upstream_host, inner)}",
        "--listen-address",
        "127.0.0.1:0",
        "--guard.listen-address",
        ",".join(_address(h, port) for h in hosts),
        "--nvml",
        "off",
    ]
    key = _option(args, "--api-key", "")
    env = dict(os.environ)
    if key:
        env["LLAMACPP_EXPORTER_API_KEY"] = key
    with (work / f"exporter-{tag}.log").open("wb") as out:
        exporter = subprocess.Popen(exporter_cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    children = (exporter, server)

    def stop(*_: object) -> None:
        for p in children:
            if p.poll() is None:
                p.terminate()
        for p in children:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    signal.signal(signal.SIGTERM, lambda *_: (stop(), sys.exit(0)))
    # Whichever ends first ends the pair: the suite sees a process that died, as with llama-server alone.
    while True:
        for p in children:
            code = p.poll()
            if code is not None:
                stop()
                return code if p is server else (code or 1)
        time.sleep(0.1)


def _outcomes(path: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        kinds = {child.tag for child in case}
        outcome = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
        out[name] = outcome
    return out


def compare(direct: str, guard: str) -> int:
    a, b = _outcomes(direct), _outcomes(guard)
    for name, runs in (("direct", a), ("guard", b)):
        counts = {k: list(runs.values()).count(k) for k in ("passed", "failed", "skipped")}
        print(
            f"{name:7} {len(runs)} tests: {counts['passed']} passed, {counts['failed']} failed, "
            f"{counts['skipped']} skipped"
        )
    differ = sorted(n for n in a.keys() | b.keys() if a.get(n) != b.get(n))
    for n in differ:
        print(f"DIFFERS {n}: direct {a.get(n, 'absent')}, guard {b.get(n, 'absent')}")
    print(f"{len(differ)} tests differ")
    return 1 if differ else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["compare"] and len(sys.argv) == 4:
        missing = [p for p in sys.argv[2:] if not Path(p).is_file()]
        if missing:
            sys.exit(f"llama_server_suite: no report {', '.join(missing)} (did that run end?)")
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    sys.exit(wrap(sys.argv[1:]))
