"""Entry point: `llamacpp-exporter --log-file PATH` (or `--demo`). Wires tail → parse → state → collector → web."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry, ProcessCollector

from exporter import __version__
from exporter.collector import CheckpointCacheCollector, ExporterCollector, ServerLogCollector
from exporter.config import Config, parse_config
from exporter.demo import replay_forever
from exporter.logs.tail import LogTailer
from exporter.pipeline import LogPipeline
from exporter.state import ServerState
from exporter.web import make_app, start_server

log = logging.getLogger("llamacpp_exporter")


def build_registry(state: ServerState, pipeline: LogPipeline) -> CollectorRegistry:
    """A registry with the exporter's collectors (and its own process metrics)."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(ServerLogCollector(lambda: state))
    registry.register(CheckpointCacheCollector(lambda: state))
    registry.register(ExporterCollector(pipeline))
    ProcessCollector(registry=registry)
    return registry


async def serve(config: Config) -> int:
    """Run until SIGINT/SIGTERM. Returns the process exit code."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):  # not on every platform
            loop.add_signal_handler(sig, stop.set)

    background: list[asyncio.Task[None]] = []
    demo_dir: tempfile.TemporaryDirectory[str] | None = None
    log_file = config.log_file
    if config.demo:
        demo_dir = tempfile.TemporaryDirectory(prefix="llamacpp-exporter-demo-")
        demo_path = Path(demo_dir.name) / "llama-server.log"
        log_file = str(demo_path)
        background.append(asyncio.create_task(replay_forever(demo_path, speed=config.demo_speed, stop=stop)))
    assert log_file is not None  # parse_config guarantees --log-file or --demo

    state = ServerState()
    tailer = None if log_file == "-" else LogTailer(log_file)
    pipeline = LogPipeline(state, tailer)
    replayed = pipeline.replay_existing()
    if tailer is not None:
        log.info("following %s (replayed %d existing lines without counting them)", log_file, replayed)

    registry = build_registry(state, pipeline)

    def health() -> dict[str, object]:
        return {"status": "ok", "version": __version__, "log": {"path": log_file, "up": pipeline.up}}

    app = make_app(registry, log_description="standard input" if log_file == "-" else log_file, health=health)
    try:
        runner = await start_server(app, config.listen_host, config.listen_port)
    except OSError as exc:
        print(
            f"llamacpp-exporter: error: --listen-address {config.listen_host}:{config.listen_port}: {exc.strerror}",
            file=sys.stderr,
        )
        for task in background:
            task.cancel()
        return 1
    log.info(
        "llamacpp-exporter %s serving on http://%s:%d/metrics",
        __version__,
        config.listen_host or "0.0.0.0",
        config.listen_port,
    )

    background.append(
        asyncio.create_task(
            pipeline.run(poll_interval=config.log_poll_interval, use_watchdog=config.fs_events, stop=stop)
        )
    )
    try:
        await stop.wait()
    finally:
        stop.set()
        for task in background:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, timeout=5)
        await runner.cleanup()
        if tailer is not None:
            tailer.close()
        if demo_dir is not None:
            demo_dir.cleanup()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Console script `llamacpp-exporter`."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["diagnose"]:
        from exporter.diagnose import main as diagnose_main

        return diagnose_main(args[1:])
    config = parse_config(args)
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    return asyncio.run(serve(config))


if __name__ == "__main__":
    sys.exit(main())
