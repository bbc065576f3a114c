"""The liveness endpoint of a task or coordinator process, answered by a thread of its own.

`GET /healthz` answers 200 while the process runs, whatever its event loop is doing:
a user function that holds the record loop for a minute is not a dead process (and
shows as stalled epochs in the job's status instead). A process that is stopped
(SIGSTOP, a frozen cgroup) or wedged with the interpreter lock held answers nothing,
and the kubelet's liveness probe ends it: the pod fails and the job recovers. A TCP
probe cannot tell: the kernel completes the handshake for a stopped process too.
Served on NOPSTREAM_HEALTH_PORT when it is set (the operator's pods), else not at all.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PATH = "/healthz"


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        found = self.path == PATH
        body = b"ok\n" if found else b"not found\n"
        self.send_response(200 if found else 404)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Probes every few seconds are not worth a log line each."""


def serve(host: str, port: int) -> ThreadingHTTPServer:
    """Start answering GET /healthz on host:port from a daemon thread; the server (its port is bound)."""
    server = ThreadingHTTPServer((host, port), _Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="liveness", daemon=True).start()
    return server
