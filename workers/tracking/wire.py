"""How a trial's metric batch goes over the wire: one attempt, a short timeout, and a connection
that is reset when it is closed, so no write can land after the trial gave it up.

A Ray node cut off from the network trains on (it cannot tell), and Ray retries its trial on
another node, which claims the run (:meth:`workers.tracking.runs.RunLogger.claim`) and logs
the epochs from its checkpoint on. A write the cut-off process had sent as the network went
sits in its kernel's send queue, and TCP delivers it when the network heals: after the new
trial logged that epoch. Three things here keep such a write from landing:

- :data:`RESET_ON_CLOSE`: every urllib3 connection a process that imports this module opens
  (MLflow's among them) has ``SO_LINGER`` on with a zero timeout, so closing it (a timed-out
  request, the process ending) resets it and the kernel drops its unsent bytes instead of
  sending them once the network is back. Set when this package (:mod:`workers.tracking`) is
  imported, before the process makes its first MLflow request through it (MLflow builds its
  HTTP session at the first request).
- :func:`log_batch` gives up a write after ``KSWEEP_MLFLOW_WRITE_TIMEOUT_S`` (10 s, under the
  30 s Ray takes to give up a node whose pings time out), and its connection goes with it.
- :func:`log_batch` makes one attempt: MLflow's client would resend a timed-out ``log-batch``
  itself, on a new connection, possibly once the network is back and after the new trial's
  claim. The writer's own retry (:mod:`workers.tracking.writer`) asks whether the step was
  written or the run has a new writer before it sends the batch again.
"""

from __future__ import annotations

import json
import socket
import struct

from urllib3.connection import HTTPConnection

__all__ = ["LOG_BATCH_ENDPOINT", "RESET_ON_CLOSE", "log_batch", "reset_connections_on_close"]

LOG_BATCH_ENDPOINT = "/api/2.0/mlflow/runs/log-batch"
# struct linger {int l_onoff; int l_linger;}: on, 0 s: close() sends RST and drops unsent data.
RESET_ON_CLOSE = (socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def reset_connections_on_close() -> None:
    """Add :data:`RESET_ON_CLOSE` to the options of every urllib3 connection opened from now on
    in this process (``HTTPConnection.default_socket_options``; MLflow's HTTP session copies them
    when it is built). Idempotent."""
    options = list(HTTPConnection.default_socket_options or [])
    if RESET_ON_CLOSE not in options:
        HTTPConnection.default_socket_options = [*options, RESET_ON_CLOSE]


def log_batch(client, run_id: str, metrics: list, timeout_s: float | None = None) -> None:
    """Write ``metrics`` to run ``run_id`` through ``client``'s tracking store.

    An HTTP store (``http://``, ``https://``) gets one ``log-batch`` request, no retry by MLflow's
    client, given up after ``timeout_s`` (default ``KSWEEP_MLFLOW_WRITE_TIMEOUT_S``); any other
    store (a local sqlite or file store) is written as ``client.log_batch`` writes it.

    Raises:
        MlflowException: what the request failed with (``INTERNAL_ERROR`` for a timeout or a
            connection refused, which the writer's retry counts as transient) or the server's
            error.
    """
    uri = str(getattr(client, "tracking_uri", ""))
    if not uri.startswith(("http://", "https://")):
        client.log_batch(run_id, metrics=metrics, synchronous=True)
        return
    from mlflow.protos.service_pb2 import LogBatch
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.proto_json_utils import message_to_json
    from mlflow.utils.rest_utils import http_request, verify_rest_response

    from workers.settings import worker_settings

    body = json.loads(
        message_to_json(LogBatch(run_id=run_id, metrics=[m.to_proto() for m in metrics]))
    )
    timeout = worker_settings().mlflow_write_timeout_s if timeout_s is None else timeout_s
    response = http_request(
        get_default_host_creds(uri),
        LOG_BATCH_ENDPOINT,
        "POST",
        json=body,
        max_retries=0,
        backoff_factor=0,
        timeout=timeout,
        raise_on_status=False,
    )
    verify_rest_response(response, LOG_BATCH_ENDPOINT)
