"""Entry point: `llamacpp-exporter` (serve: `serve.py`, built by `build.py`) and `llamacpp-exporter diagnose`.

The flags are parsed before the server's modules are imported: `--help` and a flag's error work wherever
Python does, whatever the serving code needs. A stop by Ctrl-C (or Ctrl-Break on Windows) is a clean exit
(see `serve`); one that comes before the signal handlers are in place ends with one line and exit code 130.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Sequence

#: The exit code of a program stopped by Ctrl-C before it could stop on its own (128 + SIGINT, as shells say).
INTERRUPTED = 130


def main(argv: Sequence[str] | None = None) -> int:
    """Console script `llamacpp-exporter`."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["diagnose"]:
        from exporter.diagnose import main as diagnose_main

        return diagnose_main(args[1:])
    from exporter.config import parse_config

    config = parse_config(args)
    logging.basicConfig(
        level=config.output.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        from exporter.serve import default_on_signals, serve

        try:
            return asyncio.run(serve(config))
        finally:
            default_on_signals()
    except KeyboardInterrupt:
        print("llamacpp-exporter: interrupted", file=sys.stderr)
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
