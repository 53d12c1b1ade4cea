"""Windows' console and standard input, emulated on Linux, 20 runs each: counts of what went right.

    $ .venv/bin/python bench/windows_console.py            # about 2 minutes on 2 busy cores
    $ .venv/bin/python bench/windows_console.py --runs 3

- ``diagnose > report.txt`` with standard output in cp1252 (Windows' ANSI code page, `PYTHONIOENCODING`)
  and a model path cp1252 cannot encode: the report written whole, in UTF-8, exit status 1 (a failure).
- Ctrl-C twice within a millisecond, with what Windows' Python lacks taken away (tests/support/portable:
  the stop signals through `signal.signal`): the exit status, and whether a traceback was printed.
- PowerShell 5.1's UTF-16 file on standard input (the portable configuration: read in a thread), the pipe
  left open, the exporter stopped by Ctrl-C once every line is counted: the lines counted, and whether
  Python aborted at exit ("Fatal Python error").
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))

from llama_harness import ExporterProcess, wait_for  # noqa: E402
from source_harness import SourceExporter, count_lines  # noqa: E402
from windows_logs import variant  # noqa: E402

CAPTURE = ROOT / "tests" / "fixtures" / "b11434" / "exhaust-lv4" / "llama-server.log"
PORTABLE = {"PYTHONPATH": str(ROOT / "tests" / "support" / "portable")}
MODEL = "C:/модели/模型-τ.gguf"


def diagnose_cp1252(tmp: Path) -> str:
    log = tmp / "llama-server.log"
    log.write_text(CAPTURE.read_text().replace("models/tiny-llama.gguf", MODEL), encoding="utf-8")
    report = tmp / "report.txt"
    with report.open("wb") as out:
        done = subprocess.run(
            [sys.executable, "-m", "exporter", "diagnose", str(log)],
            stdout=out,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONIOENCODING": "cp1252"},
            cwd=ROOT,
            timeout=120,
        )
    whole = f"model '{MODEL}'" in report.read_text(encoding="utf-8", errors="replace")
    return f"exit {done.returncode}, " + ("report whole" if whole and not done.stderr else "REPORT WRONG")


def double_ctrl_c(tmp: Path) -> str:
    log = tmp / "llama-server.log"
    log.write_text("")
    exporter = ExporterProcess(log, ["--nvml", "off", "--http", "off", "--proc", "off"], env=PORTABLE).start()
    proc = exporter._proc
    assert proc is not None
    proc.send_signal(signal.SIGINT)
    time.sleep(0.0005)
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGINT)
    code = proc.wait(timeout=60)
    output = exporter.output_file.read_text(errors="replace")
    traceback = "Traceback" in output or "KeyboardInterrupt" in output
    return f"exit {code}, " + ("TRACEBACK" if traceback else "no traceback")


def utf16_stdin(tmp: Path) -> str:
    data = CAPTURE.read_bytes()
    exporter = SourceExporter(
        ["--log-file", "-"], workdir=tmp, name="utf16", stdin=subprocess.PIPE, env=PORTABLE
    ).start()
    assert exporter.stdin is not None and exporter._proc is not None
    exporter.stdin.write(variant(data, "powershell51"))
    exporter.stdin.flush()  # and left open: the reading thread is blocked in a read at exit
    wait_for(
        lambda: exporter.sample("llamacpp_exporter_log_lines_total") == count_lines(data), timeout=60, what="lines"
    )
    exporter._proc.send_signal(signal.SIGINT)
    code = exporter._proc.wait(timeout=60)
    exporter.stdin.close()
    output = exporter.output_file.read_text(errors="replace")
    return f"exit {code}, lines right, " + ("ABORTED" if "Fatal Python error" in output else "no abort")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    for name, check in (
        ("diagnose > file, cp1252", diagnose_cp1252),
        ("double Ctrl-C", double_ctrl_c),
        ("UTF-16 stdin", utf16_stdin),
    ):
        tally: collections.Counter[str] = collections.Counter()
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory() as tmp:
                try:
                    tally[check(Path(tmp))] += 1
                except Exception as exc:  # a run that fails is counted as such
                    tally[f"FAILED: {exc!r}"[:120]] += 1
        print(f"{name:<26} {args.runs} runs: " + "; ".join(f"{n}x {what}" for what, n in tally.most_common()))


if __name__ == "__main__":
    main()
