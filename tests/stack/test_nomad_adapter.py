"""The Nomad adapter's settings reach python-nomad, and so every call, alike.

The client is inspected as python-nomad holds it; what goes over the wire is checked against a
small real HTTP(S) server that answers like Nomad and records what it was asked (plain HTTP
for namespace, region and token; TLS with a CA, a client certificate and a server name that
is not the address, as Nomad's own certificates are issued). Last, a job.json's namespace
on the real stack: `run`, `status`, `logs` and `stop` all find the job there.
"""

from __future__ import annotations

import http.server
import json
import os
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
import requests

from nomadtf.errors import NomadError, UnreachableError
from nomadtf.job.answers import Evaluation, Job
from nomadtf.servers.nomad import NomadAPI
from nomadtf.servers.nomadhttp import NomadSettings
from tests.helpers import nomad, nomadtf, probe_job, unique, write_job

NOMAD_ENV = (
    "NOMAD_ADDR",
    "NOMAD_TOKEN",
    "NOMAD_NAMESPACE",
    "NOMAD_REGION",
    "NOMAD_CACERT",
    "NOMAD_CLIENT_CERT",
    "NOMAD_CLIENT_KEY",
    "NOMAD_TLS_SERVER_NAME",
    "NOMAD_SKIP_VERIFY",
)
SERVER_NAME = "server.global.nomad"
TOKEN = "3f1c0e4a-0000-4000-8000-000000000001"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for key in NOMAD_ENV:
        monkeypatch.delenv(key, raising=False)
    return monkeypatch


# ---- a server that answers like Nomad and records what it was asked ----------------------------


class FakeNomad(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.seen: list[dict[str, Any]] = []
        self.answers: dict[str, tuple[int, Any]] = {}

    def answer(self, path: str, status: int = 200, body: Any = None) -> None:
        self.answers[path] = (status, {} if body is None else body)

    def queries(self) -> list[dict[str, str]]:
        return [r["query"] for r in self.seen]


class _Handler(http.server.BaseHTTPRequestHandler):
    server: FakeNomad
    protocol_version = "HTTP/1.1"

    def _reply(self) -> None:
        url = urlparse(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.server.seen.append(
            {
                "method": self.command,
                "path": url.path,
                "query": {k: v[-1] for k, v in parse_qs(url.query).items()},
                "token": self.headers.get("X-Nomad-Token"),
            }
        )
        status, body = self.server.answers.get(url.path, (200, {}))
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Nomad-Index", "42")
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_DELETE = do_PUT = _reply

    def log_message(self, *_args: Any) -> None:
        pass


def _serve(server: FakeNomad) -> Iterator[FakeNomad]:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def fake_nomad(clean_env) -> Iterator[FakeNomad]:
    server = FakeNomad()
    clean_env.setenv("NOMAD_ADDR", f"http://127.0.0.1:{server.server_address[1]}")
    yield from _serve(server)


# ---- TLS: a CA, a server certificate for server.global.nomad, a client certificate ----------


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    key = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=nomadtf test CA",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign", cwd=d)
    for name, cn, ext in (("server", SERVER_NAME, f"subjectAltName=DNS:{SERVER_NAME}\n"), ("client", "cli", "extendedKeyUsage=clientAuth\n")):
        (d / f"{name}.ext").write_text(ext)
        _openssl("req", *key, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d)
    return d


@pytest.fixture
def tls_nomad(clean_env, pki) -> Iterator[FakeNomad]:
    """Nomad with `verify_https_client = true`: no client certificate, no answer."""
    server = FakeNomad()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki / "ca.pem"))
    context.load_cert_chain(pki / "server.pem", pki / "server.key")
    context.verify_mode = ssl.CERT_REQUIRED
    server.socket = context.wrap_socket(server.socket, server_side=True)
    clean_env.setenv("NOMAD_ADDR", f"https://127.0.0.1:{server.server_address[1]}")
    yield from _serve(server)


def _tls_env(env, pki: Path) -> None:
    env.setenv("NOMAD_CACERT", str(pki / "ca.pem"))
    env.setenv("NOMAD_CLIENT_CERT", str(pki / "client.pem"))
    env.setenv("NOMAD_CLIENT_KEY", str(pki / "client.key"))
    env.setenv("NOMAD_TLS_SERVER_NAME", SERVER_NAME)


# ---- settings reach python-nomad ------------------------------------------------------------


def test_the_nomad_cli_environment_configures_python_nomad(clean_env, tmp_path):
    clean_env.setenv("NOMAD_ADDR", "https://nomad.example:4646/")
    clean_env.setenv("NOMAD_TOKEN", TOKEN)
    clean_env.setenv("NOMAD_NAMESPACE", "ml")
    clean_env.setenv("NOMAD_REGION", "europe")
    clean_env.setenv("NOMAD_CACERT", str(tmp_path / "ca.pem"))
    clean_env.setenv("NOMAD_CLIENT_CERT", str(tmp_path / "cli.pem"))
    clean_env.setenv("NOMAD_CLIENT_KEY", str(tmp_path / "cli.key"))
    clean_env.setenv("NOMAD_TLS_SERVER_NAME", SERVER_NAME)
    api = NomadAPI.from_env()
    client = api.client
    assert client.address == "https://nomad.example:4646"
    assert client.get_token() == TOKEN and client.get_namespace() == "ml" and client.region == "europe"
    assert client.verify == str(tmp_path / "ca.pem")
    assert client.cert == (str(tmp_path / "cli.pem"), str(tmp_path / "cli.key"))
    for requester in (client.job, client.jobs, client.evaluation, client.validate, client.allocation, client.client.stream_logs):
        assert (requester.verify, requester.cert, requester.token, requester.region) == (client.verify, client.cert, TOKEN, "europe")
        assert requester.session is client.session  # the one session that knows the TLS server name
    pool = client.session.get_adapter("https://nomad.example:4646").poolmanager
    assert pool.connection_pool_kw["server_hostname"] == SERVER_NAME
    assert pool.connection_pool_kw["assert_hostname"] == SERVER_NAME


def test_verification_is_on_unless_skip_verify_says_otherwise(clean_env):
    assert NomadAPI.from_env().client.verify is True  # python-nomad alone would not verify
    for value, verify in (("1", False), ("true", False), ("TRUE", False), ("0", True), ("false", True)):
        clean_env.setenv("NOMAD_SKIP_VERIFY", value)
        assert NomadAPI.from_env().client.verify is verify, value
    clean_env.setenv("NOMAD_SKIP_VERIFY", "yes please")
    with pytest.raises(NomadError, match="NOMAD_SKIP_VERIFY='yes please' is not a boolean"):
        NomadSettings.from_env()


def test_a_callers_namespace_and_region_win_over_the_environment(clean_env):
    clean_env.setenv("NOMAD_NAMESPACE", "ml")
    clean_env.setenv("NOMAD_REGION", "europe")
    api = NomadAPI.from_env(namespace="research", region="asia")
    assert (api.client.get_namespace(), api.client.region) == ("research", "asia")
    assert api.in_namespace("*").client.get_namespace() == "*"
    assert api.ui_url("digits").endswith("/ui/jobs/digits@research")


def test_defaults_and_half_configured_client_certificates(clean_env):
    settings = NomadSettings.from_env()
    assert (settings.address, settings.namespace, settings.region, settings.token) == ("http://127.0.0.1:4646", "default", None, None)
    clean_env.setenv("NOMAD_ADDR", "10.0.0.5:4646")
    assert NomadSettings.from_env().address == "http://10.0.0.5:4646"  # as the nomad CLI reads it
    clean_env.setenv("NOMAD_CLIENT_CERT", "/etc/nomad/cli.pem")
    with pytest.raises(NomadError, match="NOMAD_CLIENT_CERT and NOMAD_CLIENT_KEY go together"):
        NomadSettings.from_env()


# ---- what goes over the wire ------------------------------------------------------------------


def test_namespace_region_and_token_go_on_every_call(fake_nomad, clean_env):
    clean_env.setenv("NOMAD_TOKEN", TOKEN)
    clean_env.setenv("NOMAD_NAMESPACE", "from-env")
    fake_nomad.answer("/v1/jobs", body={"EvalID": "e1"})
    fake_nomad.answer("/v1/validate/job", body={"Warnings": ""})
    fake_nomad.answer("/v1/evaluation/e1", body={"ID": "e1", "Status": "complete"})
    fake_nomad.answer("/v1/client/fs/logs/a1", body="hello\n")
    fake_nomad.answer("/v1/allocation/a1", body={"TaskStates": {"chief": {"State": "dead"}}})
    api = NomadAPI.from_env(namespace="ml", region="europe")
    job = {"Job": {"ID": "digits", "Namespace": "ml"}}

    assert api.validate(job) == []
    assert api.register(job).eval_id == "e1"
    assert api.watch_evaluation("e1", index=7, wait_s=2) == (Evaluation("e1", status="complete"), 42)
    api.watch_allocations("digits", index=3)
    api.stop("digits", purge=True)
    assert "".join(api.follow_logs("a1", "chief")).startswith("hello\n")

    assert {r["path"] for r in fake_nomad.seen} >= {
        "/v1/validate/job", "/v1/jobs", "/v1/evaluation/e1", "/v1/job/digits/allocations", "/v1/job/digits",
        "/v1/client/fs/logs/a1", "/v1/allocation/a1",
    }
    for request in fake_nomad.seen:
        assert request["query"]["namespace"] == "ml", request
        assert request["query"]["region"] == "europe", request
        assert request["token"] == TOKEN, request
    blocking = [r["query"] for r in fake_nomad.seen if r["path"] == "/v1/evaluation/e1"][0]
    assert (blocking["index"], blocking["wait"]) == ("7", "2s")
    assert [r["query"].get("purge") for r in fake_nomad.seen if r["method"] == "DELETE"] == ["true"]


def test_403_names_the_token_and_the_missing_capability(fake_nomad, clean_env):
    fake_nomad.answer("/v1/jobs", 403, "Permission denied")
    job = {"Job": {"ID": "digits"}}
    with pytest.raises(NomadError) as anonymous:
        NomadAPI.from_env(namespace="ml").register(job)
    assert anonymous.value.status == 403
    assert "no token (NOMAD_TOKEN is not set, so Nomad applied its anonymous policy)" in str(anonymous.value)
    assert "lacks the submit-job capability in namespace 'ml'" in str(anonymous.value)

    clean_env.setenv("NOMAD_TOKEN", TOKEN)
    fake_nomad.answer("/v1/client/fs/logs/a1", 403, "Permission denied")
    with pytest.raises(NomadError) as with_token:
        NomadAPI.from_env().logs("a1", "chief")
    message = str(with_token.value)
    assert message.startswith("Nomad refused logs of a1 (403 Permission denied): the token in NOMAD_TOKEN lacks the read-logs")
    assert "namespace 'default'" in message
    assert TOKEN not in message


def test_other_refusals_and_an_empty_port(fake_nomad, clean_env):
    fake_nomad.answer("/v1/job/gone", 404, "job not found")
    fake_nomad.answer("/v1/job/gone/allocations", 404, "job not found")
    fake_nomad.answer("/v1/job/bad/plan", 400, "1 error occurred: bad job")
    api = NomadAPI.from_env()
    assert api.job("gone") is None
    assert api.watch_allocations("gone", 5) == ([], 5)  # a blocking query's 404: nothing yet
    with pytest.raises(NomadError, match=r"Nomad refused the plan \(400\): 1 error occurred: bad job"):
        api.plan({"Job": {"ID": "bad"}})
    clean_env.setenv("NOMAD_ADDR", "http://127.0.0.1:1")
    with pytest.raises(UnreachableError, match=r"cannot reach Nomad at http://127.0.0.1:1 \(job x\)"):
        NomadAPI.from_env().job("x")
    with pytest.raises(UnreachableError, match="cannot reach Nomad at http://127.0.0.1:1"):
        list(NomadAPI.from_env().follow_logs("a1", "chief"))


# ---- TLS on the wire ----------------------------------------------------------------------------


def test_tls_with_ca_client_certificate_and_server_name(tls_nomad, clean_env, pki):
    _tls_env(clean_env, pki)
    tls_nomad.answer("/v1/job/digits", body={"ID": "digits"})
    tls_nomad.answer("/v1/evaluation/e1", body={"ID": "e1"})
    tls_nomad.answer("/v1/client/fs/logs/a1", body="over tls\n")
    tls_nomad.answer("/v1/allocation/a1", body={"TaskStates": {"chief": {"State": "dead"}}})
    api = NomadAPI.from_env()
    assert api.job("digits") == Job("digits")
    assert api.watch_evaluation("e1", 0, wait_s=1)[0] == Evaluation("e1")
    assert "".join(api.follow_logs("a1", "chief")).startswith("over tls")


def test_tls_failures_say_what_to_set(tls_nomad, clean_env, pki):
    _tls_env(clean_env, pki)
    clean_env.delenv("NOMAD_TLS_SERVER_NAME")  # the certificate is not issued for 127.0.0.1
    with pytest.raises(NomadError, match="TLS with Nomad at https://127.0.0.1:.* failed .*NOMAD_TLS_SERVER_NAME"):
        NomadAPI.from_env().job("digits")
    clean_env.delenv("NOMAD_CACERT")
    clean_env.setenv("NOMAD_SKIP_VERIFY", "1")  # no CA, any name: still the client certificate
    tls_nomad.answer("/v1/job/digits", body={"ID": "digits"})
    assert NomadAPI.from_env().job("digits") == Job("digits")
    clean_env.delenv("NOMAD_CLIENT_CERT")
    clean_env.delenv("NOMAD_CLIENT_KEY")
    with pytest.raises((NomadError, UnreachableError)):
        NomadAPI.from_env().job("digits")  # Nomad wants a client certificate


# ---- a job.json's namespace on the real stack ---------------------------------------------------


@pytest.mark.stack
def test_run_status_logs_and_stop_use_the_jobs_namespace(stack, clean_env, tmp_path):
    for key, value in stack.env().items():
        clean_env.setenv(key, value)
    namespace = unique("nomadtf-ns")
    requests.post(f"{os.environ['NOMAD_ADDR']}/v1/namespace", json={"Name": namespace}, timeout=10).raise_for_status()
    job_id = unique("ns")
    spec = probe_job(job_id, context={"sleep": 2})
    spec["namespace"] = namespace
    try:
        out = nomadtf("run", str(write_job(tmp_path, spec)), "--timeout", "3m")
        assert out.returncode == 0, out.stderr
        assert f"/ui/jobs/{job_id}@{namespace}" in out.stderr
        assert nomad(f"job/{job_id}", namespace=namespace)["Status"] == "dead"
        elsewhere = nomadtf("status", job_id)
        assert elsewhere.returncode == 1 and f"no job '{job_id}' in Nomad namespace 'default'" in elsewhere.stderr
        status = nomadtf("status", job_id, "--namespace", namespace)
        assert status.returncode == 0 and "chief[0]" in status.stdout and "complete" in status.stdout
        assert f"{job_id}@{namespace}" in nomadtf("status", "--namespace", "*").stdout
        for follow in ((), ("--follow",)):
            logs = nomadtf("logs", job_id, "--namespace", namespace, *follow, timeout=60)
            assert logs.returncode == 0 and f"job={job_id}" in logs.stdout, logs.stderr
        stopped = nomadtf("stop", job_id, "--purge", "--namespace", namespace)
        assert stopped.returncode == 0, stopped.stderr
    finally:
        requests.delete(f"{os.environ['NOMAD_ADDR']}/v1/job/{job_id}", params={"namespace": namespace, "purge": "true"}, timeout=10)
        requests.delete(f"{os.environ['NOMAD_ADDR']}/v1/namespace/{namespace}", timeout=10)
