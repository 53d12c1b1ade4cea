"""--web.config.file with real TLS (certificates made here with openssl), basic auth, mTLS; a real
Prometheus scraping over https with basic auth; connection limits; no secret on any page or log line."""

from __future__ import annotations

import base64
import http.client
import os
import shutil
import socket
import ssl
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml
from llama_harness import ExporterProcess, free_port, tail_text, wait_for
from paths import B11434
from prom_harness import Prometheus, find_node_exporter, find_prometheus

from exporter.web.webconfig import BasicAuth, WebConfigError, parse_web_config

FIXTURE_LOG = B11434 / "exhaust-lv4" / "llama-server.log"
PASSWORD = "correct horse battery staple"
SECRET_IN_URL = "S3cret-in-the-url"


def _missing(what: str, hint: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(f"{what} not found under CI: {hint}", pytrace=False)
    pytest.skip(f"{what} not found: {hint}")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, made with the openssl CLI."""
    if shutil.which("openssl") is None:
        _missing("openssl", "install the openssl package")
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
             "-subj", "/CN=test CA", "-keyout", "ca.key", "-out", "ca.crt", cwd=d)  # fmt: skip
    for name, ext in (
        ("server", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
        ("client", "extendedKeyUsage=clientAuth"),
    ):
        _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj", f"/CN={name}",
                 "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)  # fmt: skip
        (d / f"{name}.ext").write_text(ext + "\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=d)  # fmt: skip
    return d


def _hash(password: str) -> str:
    import bcrypt

    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=10)).decode()


def _web_config(d: Path, *, mtls: bool = False, users: bool = True) -> Path:
    tls: dict[str, Any] = {"cert_file": "server.crt", "key_file": "server.key"}
    if mtls:
        tls |= {"client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": "ca.crt"}
    doc: dict[str, Any] = {
        "tls_server_config": tls,
        "http_server_config": {"headers": {"X-Frame-Options": "deny", "Strict-Transport-Security": "max-age=600"}},
    }
    if users:
        doc["basic_auth_users"] = {"prometheus": _hash(PASSWORD)}
    path = d / f"web-{'mtls' if mtls else 'tls'}{'-auth' if users else ''}.yml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _exporter(pki: Path, tmp_path: Path, config: Path, extra: list[str] | None = None, **kw: Any) -> SecureExporter:
    """An exporter on the seed capture behind `config`; live sources off unless `extra` says otherwise."""
    log = tmp_path / "llama-server.log"
    log.write_text(FIXTURE_LOG.read_text())
    live = extra if extra is not None else ["--http", "off"]
    return SecureExporter(
        log, ["--web.config.file", str(config), "--nvml", "off", "--proc", "off", *live], pki / "ca.crt", **kw
    )


class SecureExporter(ExporterProcess):
    """The exporter behind TLS: ready once an https GET /healthz answers."""

    def __init__(self, log_file: Path, extra: list[str], ca: Path, client: tuple[Path, Path] | None = None) -> None:
        super().__init__(log_file, extra)
        self.ctx = ssl.create_default_context(cafile=str(ca))
        if client is not None:
            self.ctx.load_cert_chain(*map(str, client))

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def get(self, path: str, auth: tuple[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx, timeout=10)
        headers = {}
        if auth is not None:
            headers["Authorization"] = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        try:
            conn.request("GET", path, headers=headers)
            resp = conn.getresponse()
            return resp.status, dict(resp.getheaders()), resp.read()
        finally:
            conn.close()

    def start(self) -> SecureExporter:
        with self.output_file.open("ab") as out:
            self._proc = subprocess.Popen(
                self.command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=self.env
            )
        deadline = time.monotonic() + self.ready_timeout
        while True:
            try:
                if self.get("/healthz")[0] in (200, 503):
                    return self
            except (OSError, ssl.SSLError):
                pass
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"exporter not ready\n{tail_text(self.output_file)}")
            time.sleep(0.05)


def test_web_config_errors_are_one_line() -> None:
    bad = {
        "tls_server_config: {cert_file: a.crt}": "missing key_file",
        "tls_server_config: {cert_file: a, key_file: b, client_auth_type: Sometimes}": "client_auth_type",
        "tls_server_config: {cert_file: a, key_file: b, curve_preferences: [X25519, CurveP256]}": "one curve",
        "tls_server_config: {cert_file: a, key_file: b, client_auth_type: RequireAndVerifyClientCert}": "client_ca_file",
        "basic_auth_users: {alice: plaintext}": "bcrypt hash",
        "http_server_config: {headers: {Server: x}}": "unknown field 'Server'",
        "tls_server_config: {cert_file: a, key_file: b, ciphers: x}": "unknown field 'ciphers'",
        "unknown: 1": "unknown field 'unknown'",
        "basic_auth_users: [": "not valid YAML",
        "basic_auth_users: 5": "basic_auth_users must be a mapping",
    }
    for text, message in bad.items():
        with pytest.raises(WebConfigError) as err:
            parse_web_config(text, Path("/etc"))
        assert message in str(err.value) and "\n" not in str(err.value), (text, str(err.value))
    cfg = parse_web_config("tls_server_config: {cert_file: a.crt, key_file: a.key}", Path("/etc/x"))
    assert cfg.tls is not None and cfg.tls.cert_file == Path("/etc/x/a.crt") and cfg.users == {}
    assert parse_web_config("", Path()).tls is None


def test_basic_auth_caches_bcrypt_and_never_the_password() -> None:
    auth = BasicAuth({"prometheus": _hash(PASSWORD)})
    assert auth.cached("prometheus", PASSWORD) is None
    started = time.perf_counter()
    assert auth.verify("prometheus", PASSWORD) and not auth.verify("prometheus", "wrong")
    assert not auth.verify("nobody", PASSWORD)
    slow = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(1000):
        assert auth.cached("prometheus", PASSWORD) is True
    assert time.perf_counter() - started < slow  # 1,000 cached checks cost less than three bcrypt runs
    assert all(PASSWORD.encode() not in key for key in auth._cache)


def test_tls_basic_auth_headers_and_plain_http_refused(pki: Path, tmp_path: Path) -> None:
    url_with_secret = f"http://admin:{SECRET_IN_URL}@127.0.0.1:{free_port()}"
    exp = _exporter(pki, tmp_path, _web_config(pki), ["--server-url", url_with_secret])
    log = exp.log_file
    with exp:
        status, headers, body = exp.get("/metrics", ("prometheus", PASSWORD))
        assert status == 200 and b"llamacpp_kv_pool_capacity_tokens 512.0" in body
        assert headers["X-Frame-Options"] == "deny" and headers["Strict-Transport-Security"] == "max-age=600"
        assert exp.get("/metrics")[0] == 401
        assert exp.get("/metrics", ("prometheus", "wrong"))[0] == 401
        assert exp.get("/metrics", ("someone", PASSWORD))[0] == 401
        assert exp.get("/", ("prometheus", "wrong"))[0] == 401
        # The status page and its JSON: the same TLS and basic auth as /metrics, and the page's CSP over both.
        assert exp.get("/")[0] == 401 and exp.get("/api/status")[0] == 401
        status, headers, body = exp.get("/", ("prometheus", PASSWORD))
        assert status == 200 and b"512 cells" in body and headers["Content-Security-Policy"].startswith("default-src")
        assert headers["X-Frame-Options"] == "deny"  # the configured headers too
        status, _, body = exp.get("/api/status", ("prometheus", PASSWORD))
        assert status == 200 and yaml.safe_load(body)["servers"][0]["pool"]["capacity"] == 512
        # /healthz answers without credentials, in words that name no path and no address.
        status, _, body = exp.get("/healthz")
        short = yaml.safe_load(body)
        assert status == 200 and set(short) == {"status", "summary"}, short
        assert str(log) not in body.decode() and "127.0.0.1" not in body.decode()
        status, _, full = exp.get("/healthz", ("prometheus", PASSWORD))
        assert status == 200 and str(log).encode() in full
        # Plain HTTP on the TLS port: no answer.
        with pytest.raises((http.client.HTTPException, OSError)):
            conn = http.client.HTTPConnection("127.0.0.1", exp.port, timeout=5)
            conn.request("GET", "/metrics")
            assert conn.getresponse().status != 200
        # The password in --server-url: on no page, in no header, in no log line.
        pages = [exp.get(path, ("prometheus", PASSWORD)) for path in ("/", "/metrics", "/healthz", "/api/status")]
        pages += [exp.get(path) for path in ("/", "/metrics", "/healthz", "/api/status")]
        for _status, headers, body in pages:
            assert SECRET_IN_URL not in body.decode() + str(headers)
        assert b"admin:***@" in pages[2][2]  # the URL is there, redacted
    output = exp.output_file.read_text()
    assert SECRET_IN_URL not in output and "serving on https://" in output and "with basic auth" in output


def test_mtls_without_a_client_certificate_is_refused(pki: Path, tmp_path: Path) -> None:
    config = _web_config(pki, mtls=True, users=False)
    exp = _exporter(pki, tmp_path, config, client=(pki / "client.crt", pki / "client.key"))
    with exp:
        assert exp.get("/metrics")[0] == 200
        anonymous = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        with pytest.raises((ssl.SSLError, OSError)):
            conn = http.client.HTTPSConnection("127.0.0.1", exp.port, context=anonymous, timeout=5)
            conn.request("GET", "/metrics")
            conn.getresponse().read()


def test_the_config_is_reloaded_when_it_changes(pki: Path, tmp_path: Path) -> None:
    config = _web_config(pki)
    exp = _exporter(pki, tmp_path, config)
    with exp:
        assert exp.get("/metrics", ("prometheus", PASSWORD))[0] == 200
        doc = yaml.safe_load(config.read_text())
        doc["basic_auth_users"] = {"scraper": _hash("new password")}
        config.write_text(yaml.safe_dump(doc))
        wait_for(lambda: exp.get("/metrics", ("scraper", "new password"))[0] == 200, 10, what="the reload")
        assert exp.get("/metrics", ("prometheus", PASSWORD))[0] == 401
        config.write_text("basic_auth_users: [")  # broken: the last good config stays
        wait_for(lambda: "web config not reloaded" in exp.output_file.read_text(), 10, what="the warning")
        assert exp.get("/metrics", ("scraper", "new password"))[0] == 200


def test_prometheus_scrapes_over_https_with_basic_auth(pki: Path, tmp_path: Path) -> None:
    prom_bin = find_prometheus() or _missing("prometheus", "run scripts/unpack-test-tools.sh")
    config = _web_config(pki)
    exp = _exporter(pki, tmp_path, config)
    with exp:
        scrape = {
            "job_name": "llamacpp",
            "scheme": "https",
            "basic_auth": {"username": "prometheus", "password": PASSWORD},
            "tls_config": {"ca_file": str(pki / "ca.crt")},
            "static_configs": [{"targets": [f"127.0.0.1:{exp.port}"]}],
        }
        prom_config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s"}, "scrape_configs": [scrape]}
        with Prometheus(prom_bin, yaml.safe_dump(prom_config)) as prom:
            wait_for(lambda: prom.query('up{job="llamacpp"} == 1'), 30, what="the https target up")
            assert prom.query('llamacpp_kv_pool_capacity_tokens{job="llamacpp"}')[0]["value"][1] == "512"


def test_node_exporter_accepts_the_same_file(pki: Path, tmp_path: Path) -> None:
    """The file is exporter-toolkit's: Debian's node_exporter (Go, exporter-toolkit) serves with it too."""
    node = find_node_exporter() or _missing("prometheus-node-exporter", "run scripts/unpack-test-tools.sh")
    config = _web_config(pki)
    port = free_port()
    argv = [str(node), f"--web.config.file={config}", f"--web.listen-address=127.0.0.1:{port}",
            "--collector.disable-defaults", "--collector.time"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        creds = "Basic " + base64.b64encode(f"prometheus:{PASSWORD}".encode()).decode()

        def status(auth: bool) -> int | None:
            try:
                conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=5)
                conn.request("GET", "/metrics", headers={"Authorization": creds} if auth else {})
                return conn.getresponse().status
            except OSError:
                return None

        wait_for(lambda: status(True) == 200, 20, what="node_exporter over https with basic auth")
        assert status(False) == 401
    finally:
        proc.terminate()
        proc.wait(10)


class LimitedExporter(ExporterProcess):
    """The exporter with 256 file descriptors at most (`prlimit`), as on a host with a low limit."""

    @property
    def command(self) -> list[str]:
        return ["prlimit", "--nofile=256:256", *super().command]


def test_held_open_and_idle_sockets_do_not_stop_metrics(tmp_path: Path) -> None:
    """50 sockets trickling a request head and 300 silent ones, at a 256-descriptor limit: /metrics answers
    every scrape meanwhile (its latency is printed; the bound is bench/'s), and the server closes them all
    within its 10 s head timeout."""
    log = tmp_path / "llama-server.log"
    log.write_text(FIXTURE_LOG.read_text())
    if shutil.which("prlimit") is None:
        _missing("prlimit", "install util-linux")
    exp = LimitedExporter(log, ["--nvml", "off", "--proc", "off", "--http", "off"])
    with exp:
        socks: list[socket.socket] = []
        try:
            for i in range(350):
                s = socket.create_connection(("127.0.0.1", exp.port), timeout=5)
                if i < 50:
                    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
                socks.append(s)
            times = []
            for _ in range(50):
                started = time.perf_counter()
                assert exp.scrape(timeout=30)  # answered while every socket is still held
                times.append((time.perf_counter() - started) * 1000)
            p99 = statistics.quantiles(times, n=100)[98]

            def closed(s: socket.socket) -> bool:
                s.settimeout(0.01)
                try:
                    return s.recv(1) == b""
                except (TimeoutError, BlockingIOError):
                    return False
                except OSError:
                    return True

            held_at = time.monotonic()
            wait_for(lambda: all(closed(s) for s in socks), 20, what="every held socket closed")
            print(f"held/idle sockets: /metrics p50 {statistics.median(times):.1f} ms, p99 {p99:.1f} ms; all 350 "
                  f"closed {time.monotonic() - held_at:.1f} s after the scrapes")  # fmt: skip
        finally:
            for s in socks:
                s.close()
        # 1,000 malformed requests: each answered, a few log lines in all.
        before = exp.output_file.read_text().count("\n")
        for _ in range(1000):
            with socket.create_connection(("127.0.0.1", exp.port), timeout=5) as s:
                s.sendall(b"\x16\x03\x01 NOT HTTP \r\n\r\n")
                s.recv(1024)
        assert exp.scrape()
        lines = exp.output_file.read_text().count("\n") - before
        print(f"1,000 malformed requests: {lines} log line(s)")
        assert lines <= 3, exp.output_file.read_text()[-2000:]
