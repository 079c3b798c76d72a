"""``make demo``: the whole product on embedded defaults, over REST.

Starts ``ksweep serve`` on 127.0.0.1, submits ``sweeps/examples/quickstart.yaml`` with
``ksweep submit``, follows it with ``ksweep watch``, prints ``ksweep report`` and the
command that opens the MLflow UI on the same store, then stops the service.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from service.settings import get_settings
from tests.support.serve_process import ServeProcess, free_port
from workers.contract import LOCAL_MLFLOW_UI, mlflow_ui_url

QUICKSTART = Path(__file__).resolve().parents[1] / "sweeps" / "examples" / "quickstart.yaml"


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex((host, port)) != 0


def _ksweep(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "service.cli", *args], env=env, text=True,
                          stdout=subprocess.PIPE if args[0] == "submit" else None)


def main() -> int:
    settings = get_settings()
    host = "127.0.0.1"
    port = settings.port if _port_free(host, settings.port) else free_port(host)
    env = {**os.environ, "KSWEEP_HOST": host, "KSWEEP_PORT": str(port),
           "KSWEEP_URL": f"http://{host}:{port}", "KSWEEP_SWEEP_ROOT": str(settings.sweep_root),
           "MLFLOW_TRACKING_URI": settings.mlflow_tracking_uri}
    server = ServeProcess(env, settings.sweep_root / "demo-serve.log", port=port, host=host)
    print(f"== starting ksweep serve on http://{host}:{port} (log: {server.log_path})", flush=True)
    try:
        try:
            server.start(timeout_s=90, probe="/readyz")
        except RuntimeError as error:
            print(error, file=sys.stderr)
            return 1
        print(f"== submitting {QUICKSTART.name} over REST", flush=True)
        submitted = _ksweep("submit", str(QUICKSTART), env=env)
        if submitted.returncode != 0:
            print(submitted.stdout)
            return submitted.returncode
        print(submitted.stdout, end="")
        sweep_id = submitted.stdout.strip().splitlines()[-1]
        print("== watching (a live progress bar until the sweep ends)", flush=True)
        watched = _ksweep("watch", sweep_id, env=env)
        print("== the comparison", flush=True)
        _ksweep("report", sweep_id, env=env)
        sweep = httpx.get(f"{server.url}/sweeps/{sweep_id}", timeout=10).json()
        experiment = sweep["mlflow"]["experiment_id"]
        print("== compare every alpha and loss stack in the MLflow UI:")
        print(f"   {Path(sys.executable).parent / 'mlflow'} ui --backend-store-uri "
              f"{settings.mlflow_tracking_uri} --port 5000")
        if experiment:
            print(f"   then open {mlflow_ui_url(LOCAL_MLFLOW_UI, experiment)}")
        return watched.returncode
    finally:
        print("== stopping the service", flush=True)
        server.stop(timeout_s=30)


if __name__ == "__main__":
    sys.exit(main())
