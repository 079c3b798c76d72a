"""``make demo``: the whole product on embedded defaults, over REST.

Starts ``ksweep serve`` on 127.0.0.1, submits ``sweeps/examples/quickstart.yaml`` with
``ksweep submit``, follows it with ``ksweep watch``, prints ``ksweep report`` (rich tables),
stops the service and ends with the command that opens the MLflow UI the report links to.
With ``--ui`` (``make demo DEMO_ARGS=--ui``) it starts that UI itself and keeps it open until
Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
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
    return subprocess.run([sys.executable, "-m", "ksweep.cli", *args], env=env, text=True,
                          stdout=subprocess.PIPE if args[0] == "submit" else None)


def _ui_command(tracking_uri: str, port: int) -> list[str]:
    return [str(Path(sys.executable).parent / "mlflow"), "ui", "--backend-store-uri", tracking_uri,
            "--host", "127.0.0.1", "--port", str(port)]


def _serve_ui(tracking_uri: str, link: str | None) -> int:
    """Run the MLflow UI on the demo's store until Ctrl-C (1 if it does not come up)."""
    if not _port_free("127.0.0.1", 5000):
        print("== port 5000 is taken (an MLflow UI already running?): open "
              f"{link or LOCAL_MLFLOW_UI}")
        return 0
    ui = subprocess.Popen(_ui_command(tracking_uri, 5000), stdout=subprocess.DEVNULL,
                          stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while _port_free("127.0.0.1", 5000):
            if ui.poll() is not None or time.monotonic() > deadline:
                print("== the MLflow UI did not start; run it yourself:\n   "
                      + " ".join(_ui_command(tracking_uri, 5000)), file=sys.stderr)
                return 1
            time.sleep(0.5)
        print(f"== MLflow UI running: open {link or LOCAL_MLFLOW_UI} (Ctrl-C stops it)", flush=True)
        ui.wait()
    except KeyboardInterrupt:
        pass
    finally:
        if ui.poll() is None:
            ui.terminate()
            ui.wait(timeout=15)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="make demo: the quickstart sweep over REST.")
    parser.add_argument("--ui", action="store_true",
                        help="start the MLflow UI on the demo's store at the end (Ctrl-C stops)")
    args = parser.parse_args(argv)
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
    finally:
        print("== stopping the service", flush=True)
        server.stop(timeout_s=30)
    link = mlflow_ui_url(LOCAL_MLFLOW_UI, experiment) if experiment else None
    if args.ui:
        return _serve_ui(settings.mlflow_tracking_uri, link) or watched.returncode
    # The report links the UI; it is not running yet: say how to open it.
    print("== compare every alpha and loss stack in the MLflow UI: run")
    print("   " + " ".join(_ui_command(settings.mlflow_tracking_uri, 5000)))
    print(f"   then open {link or LOCAL_MLFLOW_UI}   (or: make demo DEMO_ARGS=--ui)")
    return watched.returncode


if __name__ == "__main__":
    sys.exit(main())
