"""docker-compose.yml, its CPU override, .env.example and the files they mount.

No Docker engine runs here, so the stack is checked with what does run offline:

- a real Compose implementation: Debian's ``docker-compose`` 1.29.2 (``docker-compose config``
  loads, interpolates and validates the file without an engine, and rejects unknown keys);
- the Compose Specification's JSON schema (vendored by PyPI's ``check-jsonschema``);
- ``promtool check config`` on the Prometheus config exactly as the container sees it (with the rules
  file the compose file mounts), ``amtool check-config`` on the Alertmanager config it mounts;
- the rendered llama-server command line and environment, run by the real llama-server b11434.
"""

from __future__ import annotations

import copy
import importlib.resources
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any, NoReturn

import jsonschema
import pytest
import yaml
from llama_harness import REPO_ROOT, http_json, http_request
from source_harness import RenderedLlamaServer

from exporter.config import parse_config

COMPOSE = REPO_ROOT / "docker-compose.yml"
CPU_OVERRIDE = REPO_ROOT / "docker-compose.cpu.yml"
ENV_EXAMPLE = REPO_ROOT / ".env.example"


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _missing(what: str) -> NoReturn:
    if _in_ci():
        pytest.fail(f"{what} not found under CI (scripts/unpack-test-tools.sh unpacks it)", pytrace=False)
    pytest.skip(f"{what} not found (scripts/unpack-test-tools.sh unpacks it)")


@pytest.fixture(scope="module")
def docker_compose() -> Path:
    found = shutil.which("docker-compose")
    if not found:
        _missing("docker-compose (Debian package docker-compose)")
    return Path(found)


def _tool(name: str, env_var: str) -> Path:
    found = shutil.which(os.environ.get(env_var) or name)
    if not found:
        _missing(name)
    return Path(found)


def render(
    docker_compose: Path, env_file: Path, *files: Path, extra_env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """`docker-compose --env-file ENV -f FILE… config` as a dict (fails the test with compose's message)."""
    args = [str(docker_compose), "--project-directory", str(REPO_ROOT), "--env-file", str(env_file)]
    for f in files or (COMPOSE,):
        args += ["-f", str(f)]
    # Only what the test gives: a developer's own LLAMA_* or COMPOSE_* variables must not leak in.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_", "COMPOSE_", "GRAFANA_"))}
    result = subprocess.run(
        [*args, "config"], capture_output=True, text=True, timeout=120, env={**env, **(extra_env or {})}
    )
    assert result.returncode == 0, f"docker-compose config failed:\n{result.stderr}"
    rendered = yaml.safe_load(result.stdout)
    assert isinstance(rendered, dict)
    return rendered


@pytest.fixture
def env_file(tmp_path: Path) -> Path:
    """.env.example as a user's .env, with a models folder that exists."""
    models = tmp_path / "models"
    models.mkdir()
    text = ENV_EXAMPLE.read_text().replace("LLAMA_MODELS_DIR=/srv/models", f"LLAMA_MODELS_DIR={models}")
    path = tmp_path / ".env"
    path.write_text(text)
    return path


# ---------------------------------------------------------------------------------------- validation


def test_compose_file_is_valid_for_docker_compose(docker_compose: Path, env_file: Path) -> None:
    cfg = render(docker_compose, env_file)
    assert set(cfg["services"]) == {"llama-server", "llamacpp-exporter", "prometheus", "alertmanager", "grafana"}
    server, exporter = cfg["services"]["llama-server"], cfg["services"]["llamacpp-exporter"]
    assert server["image"] == "ghcr.io/ggml-org/llama.cpp:server-cuda"
    for svc in (server, exporter):
        devices = svc["deploy"]["resources"]["reservations"]["devices"]
        # Only "gpu": a driver capability here (utility, compute) would override the CUDA image's
        # NVIDIA_DRIVER_CAPABILITIES=compute,utility and leave llama-server without CUDA.
        assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}], devices
    assert "NVIDIA_DRIVER_CAPABILITIES" not in (server["environment"] or {})
    assert exporter["environment"]["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    # The exporter shares llama-server's pid namespace and log volume (read-only), and is not root.
    assert exporter["pid"] == "service:llama-server"
    assert "llama-logs:/var/log/llama:ro" in exporter["volumes"]
    assert "llama-logs:/var/log/llama:rw" in server["volumes"]
    assert server["user"] == "10001:10001"
    volume = cfg["volumes"]["llama-logs"]
    assert volume["driver_opts"]["type"] == "tmpfs" and "uid=10001" in volume["driver_opts"]["o"]
    # The flags the exporter relies on are on llama-server's command line, not left to .env.
    command = server["command"]
    assert command[command.index("--log-file") + 1] == "/var/log/llama/llama-server.log"
    assert command[command.index("-lv") + 1] == "4" and "--metrics" in command
    assert exporter["command"][exporter["command"].index("--log-file") + 1] == "/var/log/llama/llama-server.log"
    # Every llama-server option in the environment is a real LLAMA_ARG_* name, passed only when set.
    assert server["environment"]["LLAMA_ARG_CTX_SIZE"] == "32768"
    assert server["environment"]["LLAMA_ARG_KV_UNIFIED"] is None  # commented out in .env.example: not passed


def test_compose_files_match_the_compose_spec_schema() -> None:
    """`check-jsonschema --builtin-schema vendor.compose-spec` on the file; the CPU override (with its
    !reset tags, which that CLI's YAML loader does not know) through the same schema in Python."""
    result = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec", str(COMPOSE)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    schema = _compose_schema()
    override = _load_with_reset(CPU_OVERRIDE)
    jsonschema.validate(_strip_reset(override), schema)
    assert override["services"]["llama-server"]["deploy"] == _RESET


def test_cpu_override(docker_compose: Path, env_file: Path, tmp_path: Path) -> None:
    """docker-compose.yml + docker-compose.cpu.yml: the CPU image and no GPU reservation anywhere."""
    merged = _merge(yaml.safe_load(COMPOSE.read_text()), _load_with_reset(CPU_OVERRIDE))
    merged_file = tmp_path / "docker-compose.cpu-merged.yml"
    merged_file.write_text(yaml.safe_dump(merged, sort_keys=False))
    jsonschema.validate(merged, _compose_schema())
    cfg = render(docker_compose, env_file, merged_file)
    assert cfg["services"]["llama-server"]["image"] == "ghcr.io/ggml-org/llama.cpp:server"
    for name, svc in cfg["services"].items():
        assert "deploy" not in svc, f"{name} still reserves a GPU"
    assert cfg["services"]["llamacpp-exporter"]["pid"] == "service:llama-server"


def test_every_mounted_file_exists(docker_compose: Path, env_file: Path) -> None:
    """Every repository file or folder docker-compose.yml mounts (or builds from) is in the repository."""
    cfg = render(docker_compose, env_file)
    mounted = []
    for name, svc in cfg["services"].items():
        for volume in svc.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith(str(REPO_ROOT)):
                mounted.append((name, Path(source)))
        if "build" in svc:
            context = Path(svc["build"]["context"])
            mounted.append((name, context / svc["build"].get("dockerfile", "Dockerfile")))
    assert len(mounted) >= 6, mounted
    missing = [f"{name}: {path.relative_to(REPO_ROOT)}" for name, path in mounted if not path.exists()]
    assert not missing, f"docker-compose.yml mounts files that are not in the repository: {missing}"
    dashboards = [path for name, path in mounted if name == "grafana" and path.name == "dashboards"]
    assert dashboards and list(dashboards[0].glob("*.json")), "no dashboard JSON in dashboards/ for Grafana"


def _container_tree(cfg: Mapping[str, Any], service: str, prefix: str, root: Path) -> None:
    """Recreate under ``root`` the files that ``service`` sees below ``prefix`` (symlinks to the repo)."""
    for volume in cfg["services"][service]["volumes"]:
        source, target = volume.split(":")[:2]
        if source.startswith("/") and target.startswith(prefix):
            dest = root / PurePosixPath(target).relative_to(prefix)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.symlink_to(source)


def test_prometheus_config_as_mounted_passes_promtool(docker_compose: Path, env_file: Path, tmp_path: Path) -> None:
    """`promtool check config` on /etc/prometheus as the container sees it: config plus the rules it loads."""
    promtool = _tool("promtool", "PROMTOOL_BIN")
    cfg = render(docker_compose, env_file)
    etc = tmp_path / "etc-prometheus"
    _container_tree(cfg, "prometheus", "/etc/prometheus", etc)
    config = etc / "prometheus.yml"
    assert config.exists()
    result = subprocess.run([str(promtool), "check", "config", str(config)], capture_output=True, text=True, timeout=60)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "SUCCESS" in out and "rule files found" in out and " 0 rule files found" not in out, out
    # The scrape targets are the compose services, on the ports they listen on.
    prom = yaml.safe_load(config.read_text())
    targets = {t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    assert {"llamacpp-exporter:9778", "llama-server:8080", "alertmanager:9093"} <= targets
    assert prom["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["alertmanager:9093"]


def test_alertmanager_config_as_mounted_passes_amtool(docker_compose: Path, env_file: Path) -> None:
    amtool = _tool("amtool", "AMTOOL_BIN")
    cfg = render(docker_compose, env_file)
    sources = [v.split(":")[0] for v in cfg["services"]["alertmanager"]["volumes"] if v.split(":")[1].endswith(".yml")]
    assert len(sources) == 1
    result = subprocess.run([str(amtool), "check-config", sources[0]], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_grafana_provisioning(docker_compose: Path, env_file: Path) -> None:
    """The datasource points at the stack's Prometheus; the dashboard provider reads the mounted dashboards/."""
    cfg = render(docker_compose, env_file)
    grafana = cfg["services"]["grafana"]
    mounts = {v.split(":")[1]: Path(v.split(":")[0]) for v in grafana["volumes"] if v.startswith("/")}
    datasources = [p for t, p in mounts.items() if t.startswith("/etc/grafana/provisioning/datasources/")]
    providers = [p for t, p in mounts.items() if t.startswith("/etc/grafana/provisioning/dashboards/")]
    assert len(datasources) == 1 and len(providers) == 1
    ds = yaml.safe_load(datasources[0].read_text())
    assert ds["apiVersion"] == 1
    (prom,) = ds["datasources"]
    assert prom["type"] == "prometheus" and prom["url"] == "http://prometheus:9090" and prom["isDefault"]
    provider = yaml.safe_load(providers[0].read_text())["providers"][0]
    assert provider["type"] == "file"
    assert mounts[provider["options"]["path"]] == REPO_ROOT / "dashboards"
    for dashboard in (REPO_ROOT / "dashboards").glob("*.json"):
        json.loads(dashboard.read_text())  # every dashboard Grafana will load is valid JSON


# ------------------------------------------------------------------------------- .env and quoting

SPACED_ENV = """
LLAMA_MODELS_DIR={models}
LLAMA_MODEL="Tiny Llama Q8 (test).gguf"
GRAFANA_ADMIN_PASSWORD='pass word with spaces'
LLAMA_ARG_CTX_SIZE=512
LLAMA_ARG_N_PARALLEL=4
LLAMA_ARG_KV_UNIFIED=1
LLAMA_ARG_THREADS=2
LLAMA_ARG_ALIAS=tiny llama local
LLAMA_ARG_CHAT_TEMPLATE_KWARGS='{{"enable_thinking": false, "note": "a b"}}'
LLAMA_ARG_JINJA="1"
"""


@pytest.fixture
def spaced(tmp_path: Path, tiny_llama_model: Path) -> Iterator[tuple[Path, Path]]:
    """An .env whose values have spaces (quoted, unquoted, JSON), and a models folder with spaces in its path."""
    models = tmp_path / "my models"
    models.mkdir()
    shutil.copy(tiny_llama_model, models / "Tiny Llama Q8 (test).gguf")
    env = tmp_path / ".env"
    env.write_text(SPACED_ENV.format(models=models))
    yield env, models


def test_env_values_with_spaces_stay_one_value(docker_compose: Path, spaced: tuple[Path, Path]) -> None:
    """The seed incident (an unquoted `EXTRA_ARGS=--a b`, 24 restarts) cannot happen: every value is one
    argv element or one environment value after Compose has read .env."""
    env_file, models = spaced
    cfg = render(docker_compose, env_file)
    server = cfg["services"]["llama-server"]
    assert server["command"][:2] == ["--model", "/models/Tiny Llama Q8 (test).gguf"]
    assert f"{models}:/models:ro" in server["volumes"]
    environment = server["environment"]
    assert environment["LLAMA_ARG_ALIAS"] == "tiny llama local"
    assert environment["LLAMA_ARG_CHAT_TEMPLATE_KWARGS"] == '{"enable_thinking": false, "note": "a b"}'
    assert environment["LLAMA_ARG_JINJA"] == "1"
    assert cfg["services"]["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"] == "pass word with spaces"


def test_missing_required_settings_fail_with_a_clear_message(docker_compose: Path, tmp_path: Path) -> None:
    env = tmp_path / ".env"
    env.write_text("GRAFANA_ADMIN_PASSWORD=x\nLLAMA_MODELS_DIR=/srv/models\n")
    result = subprocess.run(
        [
            str(docker_compose),
            "--project-directory",
            str(REPO_ROOT),
            "--env-file",
            str(env),
            "-f",
            str(COMPOSE),
            "config",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_", "COMPOSE_", "GRAFANA_"))},
    )
    assert result.returncode != 0
    assert "set LLAMA_MODEL in .env" in result.stderr, result.stderr


@pytest.mark.llama_server
def test_rendered_llama_server_command_runs(
    docker_compose: Path, spaced: tuple[Path, Path], llama_server_bin: Path, tmp_path: Path
) -> None:
    """The real llama-server b11434 accepts the rendered command line and environment as they are
    (paths mapped from the container to here): the model path with spaces loads, the alias with
    spaces is one value, -lv 4 and --metrics are in effect, the log is written; and the exporter's
    rendered command line parses."""
    env_file, models = spaced
    cfg = render(docker_compose, env_file)
    server = cfg["services"]["llama-server"]
    log_dir = tmp_path / "log dir"
    log_dir.mkdir()

    def host_path(arg: str) -> str:
        return arg.replace("/models/", f"{models}/").replace("/var/log/llama/", f"{log_dir}/")

    argv = [host_path(a) for a in server["command"]]
    env = {k: v for k, v in server["environment"].items() if v is not None}
    with RenderedLlamaServer(llama_server_bin, argv, env, tmp_path / "llama-server.out") as srv:
        status, models_json = http_json(srv.url + "/v1/models")
        assert status == 200 and [m["id"] for m in models_json["data"]] == ["tiny llama local"], models_json
        status, props = http_json(srv.url + "/props")
        assert status == 200 and props["total_slots"] == 4, props
        assert http_request(srv.url + "/metrics")[0] == 200  # --metrics
        log_text = (log_dir / "llama-server.log").read_text()
        assert "verbosity = 4" in log_text, "-lv 4 not in effect"
        assert re.search(r"llama_context: n_ctx\s+= 512\b", log_text), "LLAMA_ARG_CTX_SIZE not in effect"

    exporter = cfg["services"]["llamacpp-exporter"]
    exporter_env = {k: v for k, v in exporter["environment"].items() if v is not None}
    config = parse_config(exporter["command"], exporter_env)
    assert (
        config.logs.file == "/var/log/llama/llama-server.log" and config.http.server_url == "http://llama-server:8080"
    )
    assert config.web.port == 9778


# ------------------------------------------------------------------------------------------ helpers


class _Reset:
    """Compose's `!reset` tag: remove the key when merging (Compose v2.24+)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Reset)

    def __hash__(self) -> int:
        return 0


_RESET = _Reset(None)


def _load_with_reset(path: Path) -> dict[str, Any]:
    class Loader(yaml.SafeLoader):
        pass

    def construct(loader: yaml.SafeLoader, node: yaml.Node) -> _Reset:
        if isinstance(node, yaml.MappingNode):
            return _Reset(loader.construct_mapping(node))
        if isinstance(node, yaml.SequenceNode):
            return _Reset(loader.construct_sequence(node))
        return _Reset(loader.construct_scalar(node))  # type: ignore[arg-type]

    Loader.add_constructor("!reset", construct)
    data = yaml.load(path.read_text(), Loader=Loader)  # a SafeLoader subclass
    assert isinstance(data, dict)
    return data


def _strip_reset(node: Any) -> Any:
    """The override as its schema sees it: a `!reset x` is the value x."""
    if isinstance(node, _Reset):
        return _strip_reset(node.value)
    if isinstance(node, dict):
        return {k: _strip_reset(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_strip_reset(v) for v in node]
    return node


def _merge(base: Any, override: Any) -> Any:
    """Compose's merge for the keys these files use: mappings merge, `!reset` removes, scalars replace."""
    if isinstance(base, dict) and isinstance(override, dict):
        out = copy.deepcopy(base)
        for key, value in override.items():
            if isinstance(value, _Reset):
                out.pop(key, None)
            elif key in out:
                out[key] = _merge(out[key], value)
            else:
                out[key] = copy.deepcopy(value)
        return out
    return copy.deepcopy(override)


def _compose_schema() -> dict[str, Any]:
    """The Compose Specification schema check-jsonschema vendors (its `vendor.compose-spec`)."""
    path = importlib.resources.files("check_jsonschema") / "builtin_schemas" / "vendor" / "compose-spec.json"
    schema = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(schema, dict)
    return schema
