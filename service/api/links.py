"""OpenAPI links between the sweep operations, so that clients and stateful fuzzers
(schemathesis' stateful phase) can chain them: the ``id`` of a sweep that a response holds is
the ``sweep_id`` of the operations on that sweep.

FastAPI has no typed way to declare links; :func:`add_links` post-processes the generated
document once (``create_app`` installs it as ``app.openapi``).
"""

from __future__ import annotations

from typing import Any

SWEEP_PATH = "/sweeps/{sweep_id}"
# The operations that act on one sweep, by (method, path below the API prefix), and their link name.
ON_ONE_SWEEP = {
    ("get", SWEEP_PATH): "GetSweep",
    ("get", SWEEP_PATH + "/trials"): "ListTrials",
    ("get", SWEEP_PATH + "/report"): "GetReport",
    ("post", SWEEP_PATH + "/cancel"): "CancelSweep",
}
# The responses whose body is one sweep (a ``Sweep`` with its ``id``).
SWEEP_RESPONSES = {
    ("post", "/sweeps"): ("201", "200"),
    ("get", SWEEP_PATH): ("200",),
    ("post", SWEEP_PATH + "/cancel"): ("200",),
}


def add_links(schema: dict[str, Any], prefix: str) -> dict[str, Any]:
    """Adds (idempotently) a link from every response holding a sweep to every operation on
    that sweep; returns ``schema``."""
    paths = schema["paths"]
    targets = {name: paths[prefix + path][method]["operationId"]
               for (method, path), name in ON_ONE_SWEEP.items()}
    for (method, path), statuses in SWEEP_RESPONSES.items():
        for status in statuses:
            response = paths[prefix + path][method]["responses"][status]
            response["links"] = {
                name: {"operationId": operation_id,
                       "parameters": {"sweep_id": "$response.body#/id"},
                       "description": f"{name} of the sweep this response holds."}
                for name, operation_id in targets.items()}
    return schema
