"""The systemd units read as systemd reads them: the exporter's ExecStart= parses, follows the server's
unit and port, runs as its user with journal access, after it, hiding neither the GPU nor its process.
systemd itself checks them in tests/system/test_deploy_systemd.py."""

from __future__ import annotations

from systemd_units import EXPORTER_UNIT, SERVER_UNIT, exec_start, unit_settings

from exporter.config import parse_config


def test_units_fit_together() -> None:
    server, exporter = unit_settings(SERVER_UNIT), unit_settings(EXPORTER_UNIT)
    argv = exec_start(EXPORTER_UNIT)
    assert argv[0] == "/usr/local/bin/llamacpp-exporter"
    config = parse_config(argv[1:], {})
    assert config.logs.source == "journald" and config.logs.journal_unit == SERVER_UNIT.name
    server_argv = exec_start(SERVER_UNIT)
    port = server_argv[server_argv.index("--port") + 1]
    assert config.http.server_url == f"http://127.0.0.1:{port}"
    assert server_argv[server_argv.index("-lv") + 1] == "4" and "--metrics" in server_argv
    # Same user (for /proc/<pid>/environ and fd), journal read access, start order, no hard dependency.
    assert exporter["Service"]["User"] == server["Service"]["User"]
    assert exporter["Service"]["SupplementaryGroups"] == ["systemd-journal"]
    assert exporter["Unit"]["After"] == [SERVER_UNIT.name] and "Requires" not in exporter["Unit"]
    assert server["Service"]["LogRateLimitIntervalSec"] == ["0"]
    # Nothing that would hide the GPU or llama-server's process from the exporter.
    for forbidden in ("PrivateDevices", "ProtectProc", "PrivateUsers"):
        assert forbidden not in exporter["Service"], forbidden
