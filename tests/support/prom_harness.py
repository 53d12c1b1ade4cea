"""Run a real Prometheus and a real Alertmanager (Debian packages) and a webhook receiver, for tests.

Plain helpers (no pytest dependency), like ``llama_harness``. Every daemon listens on a free loopback
port, keeps its data in a temporary directory, and is only ever signalled by its own pid.

    with WebhookReceiver() as hook, Alertmanager(am_config_text) as am, Prometheus(prom_config_text) as prom:
        prom.query("up")            # -> list of {"metric": {...}, "value": [ts, "1"]}
        prom.alerts()               # -> list of active alerts (pending and firing)
        hook.wait_for(lambda n: ...)  # -> the first notification that matches
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

import yaml
from llama_harness import free_port, http_request, tail_text, wait_for
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

PROMETHEUS_BINARIES = ("prometheus",)
ALERTMANAGER_BINARIES = ("prometheus-alertmanager", "alertmanager")  # Debian's name, then upstream's


def load_script(path: Path) -> ModuleType:
    """Import a script that is not in a package (alerts/generate_rules.py) as ``<folder>_<stem>``."""
    name = f"{path.parent.name}_{path.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def find_binary(names: Sequence[str], env: str) -> Path | None:
    """``$env`` if set (None unless executable), else the first of ``names`` on ``$PATH``."""
    override = os.environ.get(env)
    if override:
        found = shutil.which(override)
        return Path(found) if found else None
    for name in names:
        found = shutil.which(name)
        if found:
            return Path(found)
    return None


def find_node_exporter() -> Path | None:
    return find_binary(["prometheus-node-exporter", "node_exporter"], "NODE_EXPORTER_BIN")


def find_prometheus() -> Path | None:
    return find_binary(PROMETHEUS_BINARIES, "PROMETHEUS_BIN")


def find_alertmanager() -> Path | None:
    return find_binary(ALERTMANAGER_BINARIES, "ALERTMANAGER_BIN")


def find_amtool() -> Path | None:
    return find_binary(("amtool",), "AMTOOL_BIN")


class _Daemon:
    """A child daemon with a config file and a data directory in a private temporary directory."""

    name = "daemon"

    def __init__(self, binary: Path, config_text: str, *, ready_timeout: float = 30.0) -> None:
        self.binary = binary
        self.port = free_port()
        self.ready_timeout = ready_timeout
        self._tmp = tempfile.TemporaryDirectory(prefix=f"{self.name}-")
        self.dir = Path(self._tmp.name)
        self.config_file = self.dir / f"{self.name}.yml"
        self.config_file.write_text(config_text, encoding="utf-8")
        self.output_file = self.dir / f"{self.name}.out"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> _Daemon:
        with self.output_file.open("ab") as out:
            self._proc = subprocess.Popen(
                self.command(), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=self.dir
            )
        deadline = time.monotonic() + self.ready_timeout
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited (rc={self._proc.returncode}): {' '.join(self.command())}\n"
                    f"--- {self.output_file} (tail) ---\n{tail_text(self.output_file)}"
                )
            try:
                if http_request(self.url + "/-/ready", timeout=1.0)[0] == 200:
                    return self
            except OSError:
                pass
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{self.name} not ready after {self.ready_timeout:.0f}s\n{self.output()}")
            time.sleep(0.05)

    def output(self) -> str:
        """The daemon's own log so far (for failure messages)."""
        return f"--- {self.output_file} (tail) ---\n{tail_text(self.output_file, 60)}"

    def get_json(self, path: str, params: Mapping[str, str] | Sequence[tuple[str, str]] | None = None) -> Any:
        """GET ``path`` (with query ``params``) and decode the JSON answer; raise on a non-200 status."""
        url = self.url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        status, raw = http_request(url, timeout=10.0)
        if status != 200:
            raise RuntimeError(f"GET {url} -> {status}: {raw[:500]!r}")
        return json.loads(raw)

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)

    def close(self) -> None:
        self.stop()
        self._tmp.cleanup()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class Prometheus(_Daemon):
    """``prometheus --config.file … --storage.tsdb.path …`` on 127.0.0.1:PORT."""

    name = "prometheus"

    def command(self) -> list[str]:
        return [
            str(self.binary),
            f"--config.file={self.config_file}",
            f"--storage.tsdb.path={self.dir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]

    def __enter__(self) -> Prometheus:
        self.start()
        return self

    def _data(self, path: str, params: Mapping[str, str]) -> Any:
        body = self.get_json(path, params)
        if body.get("status") != "success":
            raise RuntimeError(f"{path} {dict(params)} -> {body}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """Instant query; the result vector (``[{"metric": {...}, "value": [ts, "v"]}, ...]``)."""
        params = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
        data = self._data("/api/v1/query", params)
        result = data["result"]
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": result}]
        return list(result)

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """Range query; the result matrix (``[{"metric": {...}, "values": [[ts, "v"], ...]}, ...]``)."""
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        return list(self._data("/api/v1/query_range", params)["result"])

    def alerts(self) -> list[dict[str, Any]]:
        """Active alerts: ``[{"labels", "annotations", "state": "pending"|"firing", "activeAt", "value"}]``."""
        return list(self._data("/api/v1/alerts", {})["alerts"])

    def rules(self) -> list[dict[str, Any]]:
        """Every loaded rule with its health (``ok``/``err``/``unknown``) and last error."""
        return [r for g in self._data("/api/v1/rules", {})["groups"] for r in g["rules"]]

    def metric_names(self) -> list[str]:
        return list(self._data("/api/v1/label/__name__/values", {}))


class Alertmanager(_Daemon):
    """``prometheus-alertmanager`` with clustering off, on 127.0.0.1:PORT."""

    name = "alertmanager"

    def __init__(self, binary: Path, config_text: str, *, ready_timeout: float = 30.0) -> None:
        super().__init__(binary, config_text, ready_timeout=ready_timeout)
        # Unpacked by scripts/unpack-test-tools.sh, Debian's binary looks for its templates here.
        assets = Path(os.path.realpath(binary)).parents[1] / "share" / "prometheus" / "alertmanager"
        if assets.is_dir():
            (self.dir / "alertmanager-assets").symlink_to(assets)

    def command(self) -> list[str]:
        return [
            str(self.binary),
            f"--config.file={self.config_file}",
            f"--storage.path={self.dir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--cluster.listen-address=",
            "--log.level=warn",
        ]

    def __enter__(self) -> Alertmanager:
        self.start()
        return self

    def post_alerts(self, alerts: Sequence[Mapping[str, Any]]) -> None:
        """POST /api/v2/alerts (what Prometheus does); raise on a non-200 answer."""
        req = urllib.request.Request(
            self.url + "/api/v2/alerts",
            data=json.dumps(list(alerts)).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            if resp.status != 200:
                raise RuntimeError(f"POST /api/v2/alerts -> {resp.status}")

    def alerts(self) -> list[dict[str, Any]]:
        """GET /api/v2/alerts: every alert with ``status.state`` and ``status.inhibitedBy``."""
        return list(self.get_json("/api/v2/alerts"))


def alertmanager_test_config(example_text: str, webhook_url: str) -> str:
    """A test copy of an Alertmanager config: every receiver posts to ``webhook_url``/<receiver name>.

    The routing tree, matchers and inhibition rules stay as they are; only the receivers' URLs are
    replaced (webhook ``url``, Slack ``api_url``) and grouping waits shortened to 1 s, so that a test sees
    a notification within a second or two of the alert. A route that notifies at once (``group_wait: 0s``,
    the pager's) still does; one that waits keeps a wait: Alertmanager's inhibitor takes in the alerts
    beside the dispatcher, and a group flushed the moment its alerts arrive can go out before the page
    that inhibits it is known (seen in CI on a busy host: the chat got a warning the page mutes).
    """
    cfg = yaml.safe_load(example_text)

    def shorten(route: dict[str, Any]) -> None:
        if "group_wait" in route:
            route["group_wait"] = "0s" if route["group_wait"] == "0s" else "1s"
        if "group_interval" in route:
            route["group_interval"] = "1s"
        for child in route.get("routes", []):
            shorten(child)

    shorten(cfg["route"])
    for receiver in cfg["receivers"]:
        url = f"{webhook_url.rstrip('/')}/{receiver['name']}"
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = url
        for chat in receiver.get("slack_configs", []):
            chat["api_url"] = url
    return str(yaml.safe_dump(cfg, sort_keys=False))


def prometheus_test_config(
    targets: Mapping[str, Sequence[str]],
    rule_files: Sequence[Path],
    alertmanager: str | None,
    *,
    scrape_interval: str = "1s",
    evaluation_interval: str = "500ms",
) -> str:
    """prometheus.yml with one job per ``targets`` entry (``{job: ["host:port", ...]}``), loading
    ``rule_files`` and sending alerts to ``alertmanager`` (host:port). The scrape timeout is the
    whole scrape interval: a busy 2-core machine can take a few hundred ms to answer."""
    cfg: dict[str, Any] = {
        "global": {
            "scrape_interval": scrape_interval,
            "scrape_timeout": scrape_interval,
            "evaluation_interval": evaluation_interval,
        },
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": list(hosts)}]} for job, hosts in targets.items()
        ],
    }
    if alertmanager:
        cfg["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    return str(yaml.safe_dump(cfg, sort_keys=False))


_PROMQL_KEYWORDS = frozenset(
    {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"}
    | {"inf", "nan", "atan2"}
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![\w.$:])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?")
_LABEL_VALUES = re.compile(r"^\s*label_values\s*\((.*),\s*[a-zA-Z_][a-zA-Z0-9_]*\s*\)\s*$", re.S)


def metric_names_in(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (also Grafana's ``label_values(expr, label)``).

    >>> sorted(metric_names_in('sum by (le) (rate(a_bucket{job=~"$job"}[$__rate_interval])) / on() b'))
    ['a_bucket', 'b']

    A small tokenizer, not a full parser: strings, label matchers, ranges and grouping clauses are
    dropped, then every identifier that is not a function call or a keyword is a metric name.
    """
    m = _LABEL_VALUES.match(expr)
    if m:
        expr = m.group(1)
    elif expr.strip().startswith("label_values("):
        return set()  # label_values(label): no metric
    text = _STRING.sub('""', expr)
    text = re.sub(r"\{[^{}]*\}", " ", text)
    text = re.sub(r"\[[^\[\]]*\]", " ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for ident, call in _IDENT.findall(text):
        if call or ident.lower() in _PROMQL_KEYWORDS:
            continue
        names.add(ident)
    return names


def collector_samples(collector: Collector) -> list[Sample]:
    """What ``collector`` puts on ``/metrics``: rendered in the text format and parsed back, as Prometheus reads it."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(collector)
    text = generate_latest(registry).decode()
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def dashboard_queries(dashboard: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every PromQL query of a Grafana dashboard as (where, expr): panel targets, annotations, variables."""
    out: list[tuple[str, str]] = []

    def panels(items: Sequence[Mapping[str, Any]]) -> None:
        for p in items:
            for t in p.get("targets", []):
                out.append((f"panel {p.get('title')!r} target {t.get('refId')}", str(t["expr"])))
            panels(p.get("panels", []))

    panels(dashboard.get("panels", []))
    for a in dashboard.get("annotations", {}).get("list", []):
        if a.get("expr"):
            out.append((f"annotation {a['name']!r}", str(a["expr"])))
    for v in dashboard.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            q = v["query"]
            out.append((f"variable {v['name']!r}", str(q["query"] if isinstance(q, dict) else q)))
    return out


@dataclass
class Notification:
    """One POST that reached the webhook receiver."""

    received: float  # time.time()
    path: str
    body: dict[str, Any] = field(default_factory=dict)


class WebhookReceiver:
    """A tiny HTTP server on 127.0.0.1 that records every JSON POST (Alertmanager webhooks, Slack posts)."""

    def __init__(self) -> None:
        self.notifications: list[Notification] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {"_raw": raw.decode(errors="replace")}
                with receiver._lock:
                    receiver.notifications.append(Notification(time.time(), self.path, body))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def received(self) -> list[Notification]:
        with self._lock:
            return list(self.notifications)

    def wait_for(self, match: Callable[[Notification], bool], timeout: float, what: str) -> Notification:
        """The first notification for which ``match`` is true, waiting up to ``timeout`` seconds."""

        def find() -> Notification | None:
            return next((n for n in self.received() if match(n)), None)

        return wait_for(find, timeout, interval=0.05, what=what)

    def __enter__(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()


__all__ = [
    "Alertmanager",
    "Notification",
    "Prometheus",
    "WebhookReceiver",
    "alertmanager_test_config",
    "collector_samples",
    "dashboard_queries",
    "find_alertmanager",
    "find_amtool",
    "find_prometheus",
    "load_script",
    "metric_names_in",
    "prometheus_test_config",
]
