"""The task's health endpoint: Nomad registers every task's service with an HTTP check on
its `health` port, and the rendezvous waits until every peer's check passes.

Standard library only, so that `python -m nomadtf task` can answer from its first
milliseconds (nomadtf.__main__ starts it before anything else is imported): Consul runs a
new check's first probe at a random moment within one interval of the registration, and a
probe that finds nothing listening costs a whole interval more of everyone's rendezvous.

Usage:
    server = serve(int(os.environ["NOMAD_PORT_health"]))   # idempotent: one server per process
    server.shutdown()
"""

from __future__ import annotations

import threading
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


def serve(port: int) -> ThreadingHTTPServer:
    """The process's health server on `port` (all interfaces: Consul's agent probes the
    address Nomad registered), started on a daemon thread the first time."""
    global _server
    with _lock:
        if _server is None:
            server = ThreadingHTTPServer(("0.0.0.0", port), _Health)
            threading.Thread(target=server.serve_forever, name="health", daemon=True).start()
            _server = server
        return _server
