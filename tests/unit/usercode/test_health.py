"""The task's health endpoint (nomadtf.usercode.health): a real HTTP server on a real socket, the
way Consul's agent probes it."""

from __future__ import annotations

import errno
import http.client
import socket

import pytest

from nomadtf.usercode import health


@pytest.fixture
def fresh(monkeypatch):
    """No health server yet in this process (it is one per process), and none left after."""
    monkeypatch.setattr(health, "_server", None)
    yield
    if health._server is not None:
        health._server.shutdown()
        health._server.server_close()


def _get(port: int, path: str) -> http.client.HTTPResponse:
    """GET as Consul's HTTP check makes it (straight to the address: no proxy)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    connection.request("GET", path)
    return connection.getresponse()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_it_listens_on_the_address_nomad_gave_the_port_else_everywhere():
    assert health.bind_host({"NOMAD_IP_health": "10.1.2.3"}) == "10.1.2.3"
    assert health.bind_host({"NOMAD_IP_health": ""}) == "0.0.0.0"
    assert health.bind_host({}) == "0.0.0.0"


def test_every_path_answers_ok_quietly_and_a_second_serve_is_the_same_server(fresh, capsys):
    port = _free_port()
    server = health.serve(port, "127.0.0.1")
    response = _get(port, "/v1/health")
    assert response.status == 200 and response.read() == b"ok\n"
    assert response.headers["Content-Length"] == "3"
    assert health.serve(port, "127.0.0.1") is server  # idempotent: __main__ started it, the supervisor asks again
    assert capsys.readouterr().err == ""  # a probe every second is not worth a log line each


def test_an_address_this_machine_lacks_falls_back_to_every_interface(fresh):
    port = _free_port()
    server = health.serve(port, "192.0.2.1")  # TEST-NET-1: no machine has it
    assert server.server_address[0] == "0.0.0.0"
    assert _get(port, "/").status == 200


def test_a_port_in_use_is_an_error_not_a_second_server_elsewhere(fresh):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError) as raised:
            health.serve(taken.getsockname()[1], "127.0.0.1")
    assert raised.value.errno == errno.EADDRINUSE
    assert health._server is None  # the next try (the supervisor's) starts from nothing


def test_a_shutdown_at_the_task_s_end_is_prompt(fresh):
    # Every task shuts its server down as it ends; socketserver's default look for a
    # shutdown every 0.5 s made that a quarter of a second per task, per job, on average.
    import time

    health.serve(_free_port(), "127.0.0.1")
    time.sleep(0.3)  # inside serve_forever's wait
    started = time.monotonic()
    health._server.shutdown()
    assert time.monotonic() - started < 0.2
    health._server.server_close()
    health._server = None
