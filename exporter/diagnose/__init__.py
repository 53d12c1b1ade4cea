"""`llamacpp-exporter diagnose LOG...`: explain KV-pool incidents from llama-server logs.

Reads a whole log once, streaming (bounded memory, any size), and tells, for each server run in it:
how it ended (cleanly, a failed start, a crash or kill with what was in flight, or the log stops),
the configuration in words (slots, per-slot window, unified pool, K/V types, bytes per KV cell), how
far the slots' promises exceed the pool, how often the server retried, cascaded and aborted, and for
each failure the tokens every aborted slot held, their share of the pool, how far the sum overflowed
it and which small requests died with the big ones. Then it says what to change, with numbers from
this log::

    $ llamacpp-exporter diagnose llama-server.log
    ...
        Failure 1 at line 354 (0:00:00.064 after start): Context size has been exceeded
          ...
          slot  task  tokens at abort  share of pool
             0    24              128         25.0 %
          ...
           sum                    513        100.2 %
          overflow: 513 - 512 = 1 token, exactly the batch of 1 token that found no room (off = 3)

Exit status: 0 no failure found, 1 at least one failure, 2 the input is not a llama-server log.

Modules: `core` (`Diagnoser`, the pure core: lines or parsed events in, a `Report` out; lines are
parsed with `exporter.logs.parse`, and each run's state and counters are an
`exporter.model.state.ServerState`, so the counts are the exporter's counters), `run` (one server run),
`advice` (what to change), `report` (the dataclasses), `read` (the only I/O: files, gzip, standard
input, patterns), `render` (text and JSON), `cli` (`main`).
"""

from exporter.diagnose.blocks import lines_of
from exporter.diagnose.cli import PROG, build_parser, main
from exporter.diagnose.core import Diagnoser, analyze
from exporter.diagnose.inputs import diagnose_file, diagnose_files, input_files
from exporter.diagnose.read import MAX_LINE_BYTES, SNIFF_BYTES, InputError, ReadStats, read_blocks, read_lines
from exporter.diagnose.render import render_text, to_json
from exporter.diagnose.report import (
    ENDINGS,
    SCHEMA,
    Configuration,
    Counts,
    Ending,
    Failure,
    FailureSummary,
    FileSummary,
    InFlight,
    LargeRequest,
    MemoryCost,
    OmittedRuns,
    Recommendation,
    Report,
    RunReport,
    SlotAtAbort,
)
from exporter.diagnose.run import elapsed_seconds, router_source

__all__ = [
    "ENDINGS",
    "MAX_LINE_BYTES",
    "PROG",
    "SCHEMA",
    "SNIFF_BYTES",
    "Configuration",
    "Counts",
    "Diagnoser",
    "Ending",
    "Failure",
    "FailureSummary",
    "FileSummary",
    "InFlight",
    "InputError",
    "LargeRequest",
    "MemoryCost",
    "OmittedRuns",
    "ReadStats",
    "Recommendation",
    "Report",
    "RunReport",
    "SlotAtAbort",
    "analyze",
    "build_parser",
    "diagnose_file",
    "diagnose_files",
    "elapsed_seconds",
    "input_files",
    "lines_of",
    "main",
    "read_blocks",
    "read_lines",
    "render_text",
    "router_source",
    "to_json",
]
