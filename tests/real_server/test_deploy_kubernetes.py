"""deploy/kubernetes/: schema validation offline, the generated PrometheusRule and dashboard ConfigMaps,
the sidecar wiring, and the pod's command line run by the real llama-server.

Validators (no cluster here):

- core objects (ConfigMap, Deployment, Service): PyPI ``kubernetes-validate`` (bundled OpenAPI schemas
  of Kubernetes 1.25-1.37), strict (unknown fields rejected), against 1.29 (the first release with
  native sidecars on by default) and its newest;
- Prometheus Operator objects (PodMonitor, PrometheusRule): PyPI
  ``cloudcoil-models-prometheus-operator`` (pydantic models generated from the operator's CRD schemas:
  types, required fields, enums, duration patterns), plus a round trip that rejects unknown fields.
  It is installed outside the virtual environment's site-packages (scripts/install-crd-models.sh)
  because it registers a pytest plugin that needs packages we do not install; the check runs in a
  subprocess with that folder on PYTHONPATH.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from llama_harness import REPO_ROOT, http_json, http_request
from source_harness import RenderedLlamaServer

from exporter.config import parse_config

K8S = REPO_ROOT / "deploy" / "kubernetes"


def _load_generator() -> ModuleType:
    """deploy/kubernetes/generate.py, the generator under test (a script, not a package module)."""
    spec = importlib.util.spec_from_file_location("llamacpp_k8s_generate", K8S / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


generate = _load_generator()

#: Where scripts/install-crd-models.sh installs the Prometheus Operator models.
CRD_MODELS = Path(os.environ.get("LLAMACPP_CRD_MODELS") or REPO_ROOT / ".venv" / "crd-models")
KUBERNETES_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())

_CRD_CHECK = r"""
import json, sys
from cloudcoil.models.prometheus_operator.v1 import PodMonitor, PrometheusRule

KINDS = {"PrometheusRule": PrometheusRule, "PodMonitor": PodMonitor}


def dropped(src, back, path="$"):
    out = []
    if isinstance(src, dict):
        if not isinstance(back, dict):
            return [f"{path}: not an object after validation"]
        for key, value in src.items():
            if key not in back:
                out.append(f"{path}.{key}: unknown field")
            else:
                out += dropped(value, back[key], f"{path}.{key}")
    elif isinstance(src, list):
        for i, (a, b) in enumerate(zip(src, back)):
            out += dropped(a, b, f"{path}[{i}]")
    return out


errors = []
for doc in json.load(sys.stdin):
    name = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
    model = KINDS.get(doc.get("kind"))
    if model is None:
        errors.append(f"{name}: no schema for this kind")
        continue
    try:
        obj = model.model_validate(doc)
    except Exception as exc:
        errors.append(f"{name}: {exc}")
        continue
    back = obj.model_dump(mode="json", by_alias=True, exclude_unset=True)
    errors += [f"{name}: {e}" for e in dropped(doc, back)]
print(json.dumps(errors))
"""


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _missing(what: str) -> NoReturn:
    if _in_ci():
        pytest.fail(f"{what} not found under CI (scripts/install-crd-models.sh installs it)", pytrace=False)
    pytest.skip(f"{what} not found (scripts/install-crd-models.sh installs it)")


def _docs(name: str) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]
    assert all(isinstance(d, dict) for d in docs)
    return docs


def _all_docs() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    return [d for name in kustomization["resources"] for d in _docs(name)]


def _one(kind: str, docs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    found = [d for d in (docs if docs is not None else _all_docs()) if d["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind} objects"
    return found[0]


# ------------------------------------------------------------------- generated from alerts/ and dashboards/


def test_generated_files_are_up_to_date() -> None:
    """prometheusrule.yaml and grafana-dashboards.yaml are exactly what generate.py makes from the sources.

    A missing source (alerts/llamacpp-rules.yml, dashboards/*.json) fails here with its name."""
    try:
        wanted = generate.outputs()
    except generate.GenerateError as exc:
        pytest.fail(f"deploy/kubernetes/generate.py cannot run: {exc}", pytrace=False)
    for path, text in wanted.items():
        assert path.exists(), f"{path.name} missing: run python deploy/kubernetes/generate.py"
        assert path.read_text() == text, f"{path.name} is stale: run python deploy/kubernetes/generate.py"
    check = subprocess.run(
        [sys.executable, str(K8S / "generate.py"), "--check"], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stderr


def test_prometheusrule_groups_are_the_rules_file_groups() -> None:
    rule = yaml.safe_load((K8S / "prometheusrule.yaml").read_text())
    rules_file = yaml.safe_load((REPO_ROOT / "alerts" / "llamacpp-rules.yml").read_text())
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["kind"] == "PrometheusRule"
    assert rule["spec"]["groups"] == rules_file["groups"]
    alerts = [r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert "LlamaCppKVPoolSaturated" in alerts, alerts


def test_dashboard_configmaps_carry_every_dashboard() -> None:
    configmaps = _docs("grafana-dashboards.yaml")
    dashboards = sorted((REPO_ROOT / "dashboards").glob("*.json"))
    assert dashboards, "no dashboards/*.json"
    by_key = {key: (cm, value) for cm in configmaps for key, value in cm["data"].items()}
    assert set(by_key) == {d.name for d in dashboards}
    for dashboard in dashboards:
        cm, value = by_key[dashboard.name]
        assert json.loads(value) == json.loads(dashboard.read_text())
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        # etcd refuses objects over ~1.5 MiB; the README says to apply with --server-side, because a
        # client-side apply also stores a copy in an annotation limited to 256 KiB.
        assert len(value.encode()) < 1024 * 1024, f"{dashboard.name} is too large for a ConfigMap"


def test_generator_fails_clearly_without_its_sources(tmp_path: Path) -> None:
    with pytest.raises(generate.GenerateError, match=r"llamacpp-rules\.yml not found"):
        generate.prometheus_rule(tmp_path / "alerts" / "llamacpp-rules.yml")
    with pytest.raises(generate.GenerateError, match=r"no dashboards in"):
        generate.dashboard_configmaps(tmp_path / "dashboards")


def test_prometheusrule_links_are_absolute_and_a_relative_one_is_refused(tmp_path: Path) -> None:
    """The committed PrometheusRule carries no link (no placeholder reaches a pager: each description names its
    runbook section); rules with a relative or placeholder link (an older rules file, a hand edit) are refused
    with the alert's name; --runbook-url and --grafana-url render the PrometheusRule with your addresses."""
    rule = yaml.safe_load((K8S / "prometheusrule.yaml").read_text())
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    for alert in alerts:
        assert not {"runbook_url", "dashboard_url"} & set(alert["annotations"]), alert["alert"]
        assert "Runbook: section " + alert["alert"] in alert["annotations"]["description"]
    rules_file = yaml.safe_load((REPO_ROOT / "alerts" / "llamacpp-rules.yml").read_text())
    saturated = next(r for g in rules_file["groups"] for r in g["rules"] if r.get("alert") == "LlamaCppKVPoolSaturated")
    for link in ("alerts/runbook.md#llamacppkvpoolsaturated", "https://git.example.com/runbook.md#x"):
        saturated["annotations"]["runbook_url"] = link
        edited = tmp_path / "llamacpp-rules.yml"
        edited.write_text(yaml.safe_dump(rules_file))
        with pytest.raises(generate.GenerateError, match=r"LlamaCppKVPoolSaturated's runbook_url .* not an absolute"):
            generate.prometheus_rule(edited)
    with pytest.raises(generate.GenerateError, match=r"runbook_url must be an absolute"):
        generate.prometheus_rule(runbook_url="alerts/runbook.md")
    mine = yaml.safe_load(
        generate.prometheus_rule(runbook_url="https://wiki.acme.corp/llama.md", grafana_url="https://g.acme.corp")
    )
    annotations = next(r for g in mine["spec"]["groups"] for r in g["rules"] if "alert" in r)["annotations"]
    assert annotations["runbook_url"] == "https://wiki.acme.corp/llama.md#llamacppkvpoolrequestsaborted"
    assert annotations["dashboard_url"].startswith("https://g.acme.corp/d/llamacpp-exporter?")


# --------------------------------------------------------------------------------------- validation


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    manifests = sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(kustomization["resources"]) == manifests


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_core_objects_pass_kubernetes_validate(version: str) -> None:
    core = [d for d in _all_docs() if not d["apiVersion"].startswith("monitoring.coreos.com/")]
    assert {d["kind"] for d in core} == {"ConfigMap", "Deployment", "Service"}
    for doc in core:
        kubernetes_validate.validate(doc, version, strict=True)
    # The validator is strict: a misspelt field is an error, not silently dropped.
    bad = copy.deepcopy(_one("Deployment", core))
    bad["spec"]["template"]["spec"]["initContainers"][0]["restartPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, version, strict=True)


def _crd_errors(docs: list[dict[str, Any]]) -> list[str]:
    if not (CRD_MODELS / "cloudcoil" / "models" / "prometheus_operator").is_dir():
        _missing(f"cloudcoil-models-prometheus-operator in {CRD_MODELS}")
    env = {**os.environ, "PYTHONPATH": str(CRD_MODELS)}
    result = subprocess.run(
        [sys.executable, "-c", _CRD_CHECK], input=json.dumps(docs), capture_output=True, text=True, timeout=120, env=env
    )
    assert result.returncode == 0, result.stderr
    errors = json.loads(result.stdout)
    assert isinstance(errors, list)
    return [str(e) for e in errors]


def test_prometheus_operator_objects_pass_their_crd_schema() -> None:
    crds = [d for d in _all_docs() if d["apiVersion"].startswith("monitoring.coreos.com/")]
    assert sorted(d["kind"] for d in crds) == ["PodMonitor", "PrometheusRule"]
    assert _crd_errors(crds) == []
    # And the check bites: an unknown field and a malformed duration are both reported.
    bad_monitor = copy.deepcopy(_one("PodMonitor", crds))
    bad_monitor["spec"]["podMetricsEndpoints"][0]["intervall"] = "15s"
    bad_rule = copy.deepcopy(_one("PrometheusRule", crds))
    next(r for g in bad_rule["spec"]["groups"] for r in g["rules"] if "alert" in r)["for"] = "five minutes"
    errors = _crd_errors([bad_monitor, bad_rule])
    assert len(errors) == 2 and "intervall: unknown field" in errors[0] and "pattern" in errors[1], errors


# ------------------------------------------------------------------------------------ sidecar wiring


def _pod() -> dict[str, Any]:
    spec: dict[str, Any] = _one("Deployment")["spec"]["template"]["spec"]
    return spec


def test_native_sidecar_shares_log_and_process_namespace() -> None:
    pod = _pod()
    assert pod["shareProcessNamespace"] is True
    (sidecar,) = pod["initContainers"]
    (server,) = pod["containers"]
    assert sidecar["name"] == "llamacpp-exporter" and sidecar["restartPolicy"] == "Always"
    args = server["args"]
    log_file = args[args.index("--log-file") + 1]
    assert sidecar["args"][sidecar["args"].index("--log-file") + 1] == log_file
    assert args[args.index("-lv") + 1] == "4" and "--metrics" in args
    mounts = {c["name"]: {m["name"]: m for m in c["volumeMounts"]} for c in (sidecar, server)}
    volumes = {v["name"]: v for v in pod["volumes"]}
    for container, mount in mounts.items():
        log_mount = mount["llama-logs"]
        assert log_file.startswith(log_mount["mountPath"] + "/"), container
    assert mounts["llamacpp-exporter"]["llama-logs"]["readOnly"] is True
    assert "emptyDir" in volumes["llama-logs"]
    assert server["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod["securityContext"]["runAsUser"] == 10001 and pod["securityContext"]["runAsNonRoot"] is True


def test_podmonitor_selects_the_pod_and_its_ports() -> None:
    monitor = _one("PodMonitor")
    deployment = _one("Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    ports = {p["name"] for c in _pod()["initContainers"] + _pod()["containers"] for p in c.get("ports", [])}
    assert {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]} == {"metrics", "http"} <= ports


def _expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in args (enough for these manifests)."""
    for key, val in env.items():
        value = value.replace(f"$({key})", val)
    assert "$(" not in value, value
    return value


@pytest.mark.llama_server
def test_pod_command_line_runs(llama_server_bin: Path, tiny_llama_model: Path, tmp_path: Path) -> None:
    """The real llama-server b11434 accepts the container's args with the ConfigMap's environment
    (paths mapped from the pod to here), and the sidecar's args parse."""
    config = _one("ConfigMap", _docs("llama-server.yaml"))["data"]
    models = tmp_path / "models"
    models.mkdir()
    (models / config["LLAMA_MODEL"]).symlink_to(tiny_llama_model)
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    env = dict(config)
    env["LLAMA_ARG_N_GPU_LAYERS"] = "0"  # no GPU here
    env["LLAMA_ARG_CTX_SIZE"] = "1024"  # the tiny model; the real value is checked to be a number
    assert int(config["LLAMA_ARG_CTX_SIZE"]) > 0
    (server,) = _pod()["containers"]
    argv = [
        _expand(a, env).replace("/models/", f"{models}/").replace("/var/log/llama/", f"{log_dir}/")
        for a in server["args"]
    ]
    with RenderedLlamaServer(llama_server_bin, argv, env, tmp_path / "llama-server.out") as srv:
        status, props = http_json(srv.url + "/props")
        assert status == 200 and props["total_slots"] == int(config["LLAMA_ARG_N_PARALLEL"]), props
        assert http_request(srv.url + "/metrics")[0] == 200
        assert "verbosity = 4" in (log_dir / "llama-server.log").read_text()
    (sidecar,) = _pod()["initContainers"]
    sidecar_env = {e["name"]: e["value"] for e in sidecar["env"]}
    parsed = parse_config(sidecar["args"], sidecar_env)
    assert parsed.logs.file == "/var/log/llama/llama-server.log" and parsed.http.server_url == "http://127.0.0.1:8080"
    assert parsed.web.port == 9778 == sidecar["ports"][0]["containerPort"]
