"""A stand-in Ray Jobs API in its own process (``python -m tests.support.fake_jobs_api PORT``):
every job is RUNNING. The fault tests SIGSTOP it to play a hung dashboard."""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (the http.server interface)
        if self.path == "/api/version":
            status, body = 200, {"version": "4", "ray_version": "2.60.0", "ray_commit": "fake"}
        elif self.path.startswith("/api/jobs/"):
            status, body = 200, {"status": "RUNNING"}
        else:
            status, body = 404, {"detail": "not found"}
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        return None


class Server(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        return None  # clients that gave up while it was stopped: nothing to report


if __name__ == "__main__":
    Server(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
