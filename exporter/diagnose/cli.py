"""`llamacpp-exporter diagnose LOG...`: arguments, exit status, writing the report."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn, TextIO

from exporter.diagnose.guard_log import join_guard_log
from exporter.diagnose.inputs import diagnose_files, input_files
from exporter.diagnose.read import InputError
from exporter.diagnose.render import json_chunks, render_text
from exporter.diagnose.report import SCHEMA, Report
from exporter.install_hint import extra_install_hint

PROG = "llamacpp-exporter diagnose"

#: The exit statuses, one meaning each (said by --help and docs/diagnose.md, from here).
EXIT_NO_FAILURE, EXIT_FAILURE, EXIT_USAGE, EXIT_INPUT, EXIT_OUTPUT = 0, 1, 2, 3, 4
EXIT_CODES = {
    EXIT_NO_FAILURE: "no failure found",
    EXIT_FAILURE: "at least one failure found",
    EXIT_USAGE: "the command line is wrong",
    EXIT_INPUT: "an input cannot be diagnosed (missing, unreadable, empty, binary, not a llama-server log)",
    EXIT_OUTPUT: "the report cannot be made or written (the html extra missing, --html naming a folder or a "
    "log, a full disk, standard output closed)",
}
EXIT_STATUS = "Exit status: " + "; ".join(f"{code} {meaning}" for code, meaning in EXIT_CODES.items()) + "."


class OutputError(Exception):
    """The report or the page cannot be made or written (`EXIT_OUTPUT`)."""


# ------------------------------------------------------------------------------------------------- CLI


class _OneLineParser(argparse.ArgumentParser):
    """One-line errors, as the exporter's own flags (exporter/flags.py)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def _non_negative(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value!r}")
    return n


def build_parser() -> argparse.ArgumentParser:
    p = _OneLineParser(
        prog=PROG,
        description="Explain KV-pool incidents from a llama-server log: configuration, overcommit, retry "
        "cascades, and for each failure the tokens every aborted slot held, the overflow and the collateral "
        "victims; then what to change, with numbers from the log.",
        epilog=f"{EXIT_STATUS} Reads plain, prefixed, coloured and --log-jsonl logs (gzip too), in bounded memory.",
    )
    p.add_argument(
        "logs",
        metavar="LOG",
        nargs="+",
        help="llama-server's --log-file, or several (rotated, gzipped, copies; a quoted pattern such as "
        "'llama-server.log*' is expanded), read oldest first; or - for standard input",
    )
    p.add_argument("--json", action="store_true", help=f"print the report as JSON (schema {SCHEMA})")
    p.add_argument(
        "--html",
        metavar="FILE",
        help="also write the report as one self-contained page with charts: every run and how it ended, "
        "the tokens each slot held over time, failures and crashes marked (needs matplotlib, the html extra: "
        f"{extra_install_hint('html')})",
    )
    p.add_argument(
        "--guard-log",
        metavar="ACCESS_LOG",
        action="append",
        help="the guard's access log (--guard.access-log; repeat it for PATH.1, or give a quoted pattern): names "
        "the client of each aborted slot and whose size caused each overflow",
    )
    p.add_argument(
        "--max-runs",
        type=_non_negative,
        default=10,
        metavar="N",
        help="show the last N server runs in detail, summarize earlier ones (default 10; 0 = all)",
    )
    p.add_argument(
        "--max-failures",
        type=_non_negative,
        default=10,
        metavar="N",
        help="per run, show the first and last failures up to N in detail (default 10; 0 = all)",
    )
    return p


def main(argv: Sequence[str]) -> int:
    """`llamacpp-exporter diagnose LOG... [--json] [--html FILE]`; returns the exit status."""
    parser = build_parser()
    ns = parser.parse_args(list(argv))
    try:
        paths, order = input_files(ns.logs)
        if ns.html is not None:
            _check_html(ns.html, paths)  # said before the logs are read, not after
        # The chart's series is in the JSON too (what --html plots).
        series = ns.html is not None or ns.json
        report = diagnose_files(paths, max_runs=ns.max_runs, max_failures=ns.max_failures, series=series)
        report.files_order = order
        if ns.guard_log:
            report.guard = join_guard_log(report, input_files(ns.guard_log)[0])
        if ns.html is not None:
            _write_html(report, ns.html)
    except InputError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except OutputError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_OUTPUT
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    out = sys.stdout
    try:
        if out is None:  # started with standard output closed (`>&-`)
            raise OSError("standard output is closed")
        _any_text(out)
        if ns.json:
            for chunk in json_chunks(report):
                out.write(chunk)
            out.write("\n")
        else:
            out.write(render_text(report))
        out.flush()
    except BrokenPipeError:  # `diagnose LOG | head`
        _discard_stdout()
        return report.exit_status
    except OSError as exc:  # e.g. ENOSPC: `diagnose LOG > /dev/full`
        _discard_stdout()
        print(f"{PROG}: error: cannot write the report: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_OUTPUT
    return report.exit_status


def _check_html(path: str, inputs: Sequence[str]) -> None:
    """What makes `--html FILE` fail, found before the logs are read: raises `OutputError`."""
    try:
        import matplotlib.figure  # noqa: F401
    except ImportError:
        raise OutputError(f"--html needs matplotlib, the html extra: {extra_install_hint('html')}") from None
    target = Path(path)
    if not target.name or target.is_dir():
        raise OutputError(f"{path or repr(path)}: --html needs a file name, not a folder")
    for log in inputs:
        with contextlib.suppress(OSError):
            if log != "-" and target.exists() and target.samefile(log):
                raise OutputError(f"{path}: is one of the logs read; --html would write over it")


def _write_html(report: Report, path: str) -> None:
    """Write the page to `path` (atomically: a reader never sees half of it)."""
    from exporter.diagnose.html import render_html

    try:
        page = render_html(report)
    except Exception as exc:  # a chart matplotlib cannot draw must not end in a traceback
        raise OutputError(f"{path}: cannot draw the page: {exc}") from None
    target = Path(path)
    tmp = target.with_name(f".{target.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(page, encoding="utf-8")
        tmp.replace(target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise OutputError(f"{path}: cannot write the page: {exc.strerror or exc}") from None
    print(f"{PROG}: wrote {path} ({len(page.encode()) / 1024:,.0f} KiB)", file=sys.stderr)


def _any_text(out: TextIO) -> None:
    """Have `out` take any text: a log's paths and model names may hold characters that Windows' console
    code page (cp1252, say) cannot encode. A console shows them replaced; anything else (`> report.txt`,
    a pipe) gets UTF-8."""
    reconfigure = getattr(out, "reconfigure", None)
    if reconfigure is None:  # not a TextIOWrapper (a test's StringIO): it takes any text already
        return
    with contextlib.suppress(OSError, ValueError):
        if out.isatty():
            reconfigure(errors="replace")
        else:
            reconfigure(encoding="utf-8", errors="replace")


def _discard_stdout() -> None:
    """Point standard output at /dev/null, so that Python's own flush at exit does not fail a second time."""
    if sys.stdout is not None:
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
