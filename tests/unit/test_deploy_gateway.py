"""The inference-gateway example (deploy/kubernetes/inference-gateway/): valid objects, wired to the exporter.

Gateway API Inference Extension's endpoint picker reads two metrics of every model server, by names
its flags set, with the types and meaning of its model server protocol: the queued requests (a gauge)
and the KV-cache utilization (a gauge, 0 to 1); newer pickers read the running requests too. The test
holds the example to that: the picker's flags name series the real exporter exports with those types
and ranges, on a real capture and with llama-server's own `/metrics` read as a live source.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from paths import B11434, REPO
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.logs.tail import LogTailer
from exporter.metrics.servers import log_collectors
from exporter.model.live import HttpSnapshot
from exporter.model.state import ServerState
from exporter.pipeline import LogPipeline
from exporter.sources.live import LiveSources
from exporter.sources.server_http import REQUESTS_DEFERRED, parse_metrics
from exporter.unit import ServerUnit

ROOT = REPO
EXAMPLE = ROOT / "deploy" / "kubernetes" / "inference-gateway"
BASE = EXAMPLE.parent
CAPTURE = B11434 / "pool-overflow-lv4"
KUBERNETES_VERSIONS = ("1.29", "1.37")

# InferencePool (inference.networking.k8s.io/v1) as its API reference defines the fields used here:
# selector.matchLabels, one target port, the endpoint picker's Service and port, its failure mode.
_PORT = {"type": "object", "properties": {"number": {"type": "integer", "minimum": 1, "maximum": 65535}},
         "required": ["number"], "additionalProperties": False}  # fmt: skip
INFERENCE_POOL_V1: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "inference.networking.k8s.io/v1"},
        "kind": {"const": "InferencePool"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["selector", "targetPorts", "endpointPickerRef"],
            "additionalProperties": False,
            "properties": {
                "selector": {
                    "type": "object",
                    "required": ["matchLabels"],
                    "additionalProperties": False,
                    "properties": {"matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}},
                },
                "targetPorts": {"type": "array", "minItems": 1, "maxItems": 1, "items": _PORT},
                "endpointPickerRef": {
                    "type": "object",
                    "required": ["name"],
                    "additionalProperties": False,
                    "properties": {
                        "name": {"type": "string", "minLength": 1},
                        "kind": {"type": "string"},
                        "group": {"type": "string"},
                        "port": _PORT,
                        "failureMode": {"enum": ["FailOpen", "FailClose"]},
                    },
                },
            },
        },
    },
}


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _example() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((EXAMPLE / "kustomization.yaml").read_text())
    return [d for r in kustomization["resources"] if r != "../" for d in _docs(EXAMPLE / r)]


def _one(kind: str, name: str, docs: list[dict[str, Any]]) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def _epp_flags() -> dict[str, str]:
    container = _one("Deployment", "llama-server-epp", _example())["spec"]["template"]["spec"]["containers"][0]
    return dict(arg.removeprefix("--").split("=", 1) for arg in container["args"])


def test_the_kustomization_builds_on_the_base_and_lists_every_file() -> None:
    kustomization = yaml.safe_load((EXAMPLE / "kustomization.yaml").read_text())
    files = sorted(p.name for p in EXAMPLE.glob("*.yaml") if p.name != "kustomization.yaml")
    assert kustomization["resources"][0] == "../" and sorted(kustomization["resources"][1:]) == files
    (patch,) = kustomization["patches"]
    assert patch["target"] == {"kind": "Deployment", "name": "llama-server"}
    assert _one("Deployment", "llama-server", _docs(BASE / "llama-server.yaml"))  # what the patch targets


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_core_objects_pass_kubernetes_validate(version: str) -> None:
    core = [d for d in _example() if d["kind"] != "InferencePool"]
    assert sorted(d["kind"] for d in core) == ["Deployment", "Role", "RoleBinding", "Service", "ServiceAccount"]
    for doc in core:
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_inference_pool_is_valid_and_selects_the_model_servers() -> None:
    pool = _one("InferencePool", "llama-server", _example())
    jsonschema.validate(pool, INFERENCE_POOL_V1)
    bad = copy.deepcopy(pool)
    bad["spec"]["targetPortNumber"] = 8080  # a pre-v1 field: refused
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, INFERENCE_POOL_V1)
    server = _one("Deployment", "llama-server", _docs(BASE / "llama-server.yaml"))["spec"]["template"]
    labels = server["metadata"]["labels"]
    assert pool["spec"]["selector"]["matchLabels"].items() <= labels.items()
    containers = {c["name"]: c for c in server["spec"]["containers"] + server["spec"].get("initContainers", [])}
    ports = {p["name"]: p["containerPort"] for c in containers.values() for p in c.get("ports", [])}
    assert pool["spec"]["targetPorts"] == [{"number": ports["http"]}]  # requests go to llama-server
    picker = _one("Service", "llama-server-epp", _example())
    assert pool["spec"]["endpointPickerRef"]["port"]["number"] == picker["spec"]["ports"][0]["port"]
    # The picker scrapes the exporter sidecar; llama-server runs with --metrics and the exporter reads it.
    assert int(_epp_flags()["model-server-metrics-port"]) == ports["metrics"]
    assert "--metrics" in containers["llama-server"]["args"]
    assert "--server-url" in containers["llamacpp-exporter"]["args"]


def _exported() -> dict[str, tuple[str, list[float]]]:
    """The real exporter's families (type, values) after a real capture, with llama-server's /metrics read."""
    state = ServerState()
    tailer = LogTailer(CAPTURE / "llama-server.log")
    pipeline = LogPipeline(state, tailer)
    pipeline.replay_existing()
    tailer.close()
    deferred = parse_metrics((CAPTURE / "metrics.txt").read_text())[0][REQUESTS_DEFERRED]
    live = LiveSources(state)
    live.http = HttpSnapshot(up=True, deferred=deferred)  # as a read of it found it
    registry = CollectorRegistry()
    for collector in log_collectors(ServerUnit(state, live).make_view):
        registry.register(collector)
    text = generate_latest(registry).decode()
    return {f.name: (f.type, [s.value for s in f.samples]) for f in text_string_to_metric_families(text)}


def test_the_picker_reads_gauges_the_exporter_exports_with_the_protocols_meaning() -> None:
    families = _exported()
    flags = _epp_flags()
    utilization = flags["kv-cache-usage-percentage-metric"]
    for flag in ("kv-cache-usage-percentage-metric", "total-queued-requests-metric", "total-running-requests-metric"):
        name = flags[flag]
        assert name in families, (flag, name)
        kind, values = families[name]
        assert kind == "gauge" and len(values) == 1, (name, kind, values)  # one unlabelled gauge per server
        assert (values[0] >= 0 and float(values[0]).is_integer()) or name == utilization
    assert 0 <= families[utilization][1][0] <= 1
    assert flags["lora-info-metric"] == ""
