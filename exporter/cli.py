"""Entry point: `llamacpp-exporter` (serve: `serve.py`, built by `build.py`) and `llamacpp-exporter diagnose`."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Console script `llamacpp-exporter`."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["diagnose"]:
        from exporter.diagnose import main as diagnose_main

        return diagnose_main(args[1:])
    from exporter.config import parse_config
    from exporter.serve import serve

    config = parse_config(args)
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    return asyncio.run(serve(config))


if __name__ == "__main__":
    sys.exit(main())
