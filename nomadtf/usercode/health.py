"""The task's health endpoint: Nomad registers every task's service with an HTTP check on
its `health` port, and the rendezvous waits until every peer's check passes.

Standard library only, so that `python -m nomadtf task` can answer from its first
milliseconds (nomadtf.__main__ starts it before anything else is imported): Consul runs a
new check's first probe at a random moment within one interval of the registration, and a
probe that finds nothing listening costs a whole interval more of everyone's rendezvous.

Usage:
    server = serve(int(os.environ["NOMAD_PORT_health"]))   # on NOMAD_IP_health; idempotent: one per process
    server.shutdown()
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_server: ThreadingHTTPServer | None = None
_lock = threading.Lock()


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        body = b"ok\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: Any) -> None:
        pass  # Consul checks every second; not worth a log line each


ENV_HOST = "NOMAD_IP_health"  # the address Nomad gave the task's `health` port (templates/group.json.j2)
ANY_HOST = "0.0.0.0"


def bind_host(environ: Mapping[str, str]) -> str:
    """Where the health server listens: the task's own address, which Nomad registered and
    Consul's agent probes; every interface only when Nomad gave none. Pure."""
    return environ.get(ENV_HOST) or ANY_HOST


SHUTDOWN_POLL_S = 0.05


def serve(port: int, host: str | None = None) -> ThreadingHTTPServer:
    """The process's health server on `host`:`port` (default `bind_host(os.environ)`; an
    address this machine does not have falls back to every interface), started on a daemon
    thread the first time."""
    global _server
    with _lock:
        if _server is None:
            host = host or bind_host(os.environ)
            try:
                server = ThreadingHTTPServer((host, port), _Health)
            except OSError as exc:
                if host == ANY_HOST or exc.errno != errno.EADDRNOTAVAIL:
                    raise
                server = ThreadingHTTPServer((ANY_HOST, port), _Health)
            # serve_forever looks for a shutdown every poll interval, and a task's exit waits
            # for that (socketserver's default, 0.5 s, was a quarter of a second per task at
            # the end of every job on average); 20 looks a second cost nothing measurable.
            threading.Thread(target=server.serve_forever, kwargs={"poll_interval": SHUTDOWN_POLL_S}, name="health", daemon=True).start()
            _server = server
        return _server
