"""A run's archive and notify on the real stack: the outcome is POSTed by the task that
records it (also for a `--detach`ed run nobody follows), with the URL's credentials from the
job's Nomad variable; an unreachable URL changes nothing; once Nomad has purged and collected
the job, `nomadtf status` and `nomadtf logs` read the run's archive."""

from __future__ import annotations

import http.server
import json
import os
import queue
import socket
import threading
import time

import pytest
import requests

from tests.helpers import nomadtf, probe_job, purge, unique, wait_until, write_job

pytestmark = pytest.mark.stack


@pytest.fixture
def receiver():
    """A local HTTP server that keeps every POST (headers and JSON body)."""
    got: queue.Queue = queue.Queue()

    class Keep(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            got.put((dict(self.headers), json.loads(body), time.time()))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *_args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Keep)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook?channel=ml", got
    server.shutdown()


def _job(name: str, url: str, **context) -> dict:
    spec = probe_job(name, "multi_worker_mirrored", context=context, notify={"url": url})
    spec["roles"] = {"worker": {"count": 1, "cpu": 200, "memory": 600}}
    return spec


def _put_variable(name: str, items: dict) -> None:
    """nomad var put nomad/jobs/<job> ...: PUT /v1/var/nomad/jobs/<job>"""
    path = f"nomad/jobs/{name}"
    requests.put(f"{os.environ['NOMAD_ADDR']}/v1/var/{path}", json={"Path": path, "Items": items}, timeout=10).raise_for_status()


def _delete_variable(name: str) -> None:
    requests.delete(f"{os.environ['NOMAD_ADDR']}/v1/var/nomad/jobs/{name}", timeout=10)


def _dead(name: str) -> bool:
    resp = requests.get(f"{os.environ['NOMAD_ADDR']}/v1/job/{name}", timeout=10)
    return resp.ok and resp.json()["Status"] == "dead"


def test_a_detached_run_notifies_and_its_archive_outlives_nomad(stack, tmp_path, receiver):
    url, got = receiver
    name = unique("archived")
    _put_variable(name, {"notify_url": "ml-bot:s3cret-pw"})  # credentials only, never in the job
    try:
        job = write_job(tmp_path, _job(name, url))
        rendered = nomadtf("render", str(job))
        assert rendered.returncode == 0 and "s3cret" not in rendered.stdout and "notify_url" in rendered.stdout
        started = nomadtf("run", str(job), "--detach")
        assert started.returncode == 0, started.stderr
        headers, body, _at = got.get(timeout=120)  # nobody follows the run: its task sent it
        assert body["outcome"] == "succeeded" and body["job"] == name and body["namespace"] == "default"
        assert body["run_id"] and body["recorded_by"] == "worker[0]" and body["duration_s"] > 0
        assert body["what_to_do"] == ""
        assert headers["Authorization"] == "Basic bWwtYm90OnMzY3JldC1wdw=="  # ml-bot:s3cret-pw
        wait_until(lambda: _dead(name), 90, "the job to end")
        before = nomadtf("logs", name, "--role", "worker", "--stderr")
        assert "s3cret" not in before.stdout + before.stderr and "127.0.0.1" in before.stdout + before.stderr
        purge(name)
        requests.put(f"{os.environ['NOMAD_ADDR']}/v1/system/gc", timeout=30).raise_for_status()
        wait_until(lambda: requests.get(f"{os.environ['NOMAD_ADDR']}/v1/job/{name}", timeout=10).status_code == 404, 30, "the purge")
        status = nomadtf("status", name)
        assert status.returncode == 0, status.stderr
        assert "collected by Nomad" in status.stdout and "outcome: succeeded" in status.stdout, status.stdout
        assert body["run_id"] in status.stdout
        logs = nomadtf("logs", name, "--role", "worker")
        assert logs.returncode == 0, logs.stderr
        assert logs.stdout.rstrip().endswith("probe finished"), logs.stdout
    finally:
        purge(name)
        _delete_variable(name)


def test_a_failure_is_notified_with_what_to_do(stack, tmp_path, receiver):
    url, got = receiver
    name = unique("notifyfail")
    job = write_job(tmp_path, _job(name, url, **{"raise": True}))
    try:
        ran = nomadtf("run", str(job), "--timeout", "4m")
        assert ran.returncode == 1, ran.stderr
        _headers, body, at = got.get(timeout=30)
        assert body["outcome"] == "failed" and "worker[0] exited 1" in body["reason"]
        assert "boom from user code" in body["what_to_do"] and "nomadtf logs" in body["what_to_do"]
        assert time.time() - at < 60
    finally:
        purge(name)


def test_an_unreachable_url_changes_nothing(stack, tmp_path):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    name = unique("notifynowhere")
    job = write_job(tmp_path, _job(name, f"http://127.0.0.1:{port}/hook"))
    try:
        ran = nomadtf("run", str(job), "--timeout", "4m")
        assert ran.returncode == 0, ran.stderr
        assert "succeeded" in ran.stderr
    finally:
        purge(name)
