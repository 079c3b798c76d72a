"""Answers of the tests' stand-in HTTP servers (a Ray Jobs API and its head)."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from typing import Any


def answer_json(handler: BaseHTTPRequestHandler, status: int, body: Any) -> None:
    """Send ``body`` as a JSON response with ``status``, its length declared."""
    payload = json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(payload)))
    handler.end_headers()
    handler.wfile.write(payload)
