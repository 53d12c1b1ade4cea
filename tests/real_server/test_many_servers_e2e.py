"""Two independent real llama-servers followed by one exporter (`--servers-file`) give exactly the series of
two single-server exporters, each with its `server` label; the host's and the exporter's own series once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import yaml
from llama_harness import ExporterProcess, LlamaServer, http_json, wait_for
from prometheus_client.parser import text_string_to_metric_families

from exporter.metrics.servers import GLOBAL_FAMILIES

pytestmark = pytest.mark.llama_server

ARGS = ["-c", "1024", "-np", "2", "-kvu", "-lv", "4"]
#: Read at each scrape, so they differ between two exporters even about the same server: compared by
#: name and labels, not value. (The exporter's own process_* and python_* series are its own, left out.)
VOLATILE = {
    "llamacpp_exporter_source_read_duration_seconds",
    "llamacpp_process_resident_memory_bytes",
    "llamacpp_host_memory_available_bytes",
    "llamacpp_exporter_log_lines_total",  # lines read live: the rest were replayed at the exporter's start
    "llamacpp_exporter_log_replayed_lines",
}

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class ServersFileExporter(ExporterProcess):
    """The exporter with `--servers-file FILE` instead of `--log-file`."""

    def __init__(self, servers_file: Path, extra: list[str], output_file: Path) -> None:
        super().__init__(servers_file, extra, output_file=output_file)

    @property
    def command(self) -> list[str]:
        return [*super().command[:3], "--servers-file", str(self.log_file), *super().command[5:]]


def _series(text: str) -> Series:
    out: Series = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith(("process_", "python_")):
            continue
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


def _family(sample: str) -> str:
    for suffix in ("_total", "_info", "_bucket", "_count", "_sum"):
        if sample.endswith(suffix) and sample[: -len(suffix)] in GLOBAL_FAMILIES:
            return sample[: -len(suffix)]
    return sample


def _with_server(series: Series, server: str) -> Series:
    return {
        (name, labels if _family(name) in GLOBAL_FAMILIES else tuple(sorted((*labels, ("server", server))))): v
        for (name, labels), v in series.items()
    }


@pytest.fixture(scope="module")
def servers(llama_server_bin: Path, tiny_llama_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    tmp = tmp_path_factory.mktemp("many")
    with ExitStack() as stack:
        a = stack.enter_context(LlamaServer(llama_server_bin, tiny_llama_model, ARGS, log_file=tmp / "a.log"))
        b = stack.enter_context(LlamaServer(llama_server_bin, tiny_llama_model, ARGS, log_file=tmp / "b.log"))
        spec = {
            "servers": [
                {"name": "a", "log_file": str(a.log_file), "url": a.url},
                {"name": "b", "log_file": str(b.log_file), "url": b.url},
            ]
        }
        (tmp / "servers.yml").write_text(yaml.safe_dump(spec))
        common = ["--nvml", "off"]
        one_a = stack.enter_context(
            ExporterProcess(a.log_file, ["--server-url", a.url, *common], output_file=tmp / "ea")
        )
        one_b = stack.enter_context(
            ExporterProcess(b.log_file, ["--server-url", b.url, *common], output_file=tmp / "eb")
        )
        both = stack.enter_context(ServersFileExporter(tmp / "servers.yml", common, tmp / "eab"))
        yield a, b, one_a, one_b, both


def test_two_servers_in_one_exporter_equal_two_exporters_plus_the_server_label(servers: Any) -> None:
    a, b, one_a, one_b, both = servers
    # Different work on each: two requests on a, one longer on b.
    for url, prompt, n in ((a.url, "Hello there", 8), (a.url, "General Kenobi", 4), (b.url, "x " * 100, 16)):
        status, body = http_json(url + "/completion", body={"prompt": prompt, "n_predict": n, "ignore_eos": True})
        assert status == 200, body

    def settled() -> tuple[Series, Series, Series] | None:
        sa, sb, sab = (_series(e.scrape()) for e in (one_a, one_b, both))
        ta, tb = (
            s.get(("llamacpp_generated_tokens_total", ())) for s in (sa, sb)
        )  # the timing lines are the requests' last
        tab = {sv: sab.get(("llamacpp_generated_tokens_total", (("server", sv),))) for sv in "ab"}
        return (sa, sb, sab) if ta == 12 and tb == 16 and tab == {"a": 12, "b": 16} else None

    sa, sb, sab = wait_for(settled, 30, interval=0.2, what="every exporter to read both requests' last lines")
    want = {**_with_server(sa, "a"), **_with_server(sb, "b")}
    assert set(sab) == set(want), (sorted(set(sab) - set(want))[:10], sorted(set(want) - set(sab))[:10])
    differ = {k: (sab[k], want[k]) for k in sab if _family(k[0]) not in VOLATILE and sab[k] != want[k]}
    assert differ == {}
    print(f"\n{len(sab)} series in the two-server exporter = {len(sa)} + {len(sb)} of the single ones, less the shared")
    assert len(sab) > 150  # the comparison covers every family (two servers with two slots each)
    assert (
        sab[("llamacpp_slot_tokens", (("server", "b"), ("slot", "0")))]
        + sab[("llamacpp_slot_tokens", (("server", "b"), ("slot", "1")))]
        > 100
    )
