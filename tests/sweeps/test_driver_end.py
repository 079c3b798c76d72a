"""A driver's local Ray starts without the daemons a one-node sweep does not use (or with all
of them: ``KSWEEP_LOCAL_RAY=full``), and a driver process ends at once: its local Ray stopped
whole, monitor included, and no final garbage collection
(``sweeps.tune.setup.end_driver_process``)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sweeps.tune.setup import ensure_ray

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import gc, json, ray, psutil
from sweeps.tune.setup import end_driver_process, ensure_ray
ensure_ray(num_cpus=1)
node = ray._private.worker._global_node
started = {kind: [info.process.pid for info in infos] for kind, infos in node.all_processes.items()}
end_driver_process()
alive = sorted(kind for kind, pids in started.items()
               if any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                      for pid in pids))
print(json.dumps({"kinds": sorted(started), "alive": alive, "initialized": ray.is_initialized(),
                  "frozen": gc.get_freeze_count()}))
"""


# Ray's names (ray_constants.PROCESS_TYPE_*) of the processes a lean local Ray leaves out.
UNUSED_DAEMONS = {"monitor", "log_monitor", "dashboard"}


@pytest.mark.parametrize("mode", ["lean", "full"])
def test_end_driver_process_stops_every_ray_process_and_freezes_the_heap(mode):
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin",
                                            "RAY_prestart_worker_first_driver": "0",
                                            "KSWEEP_LOCAL_RAY": mode})
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"gcs_server", "raylet"} <= set(result["kinds"]), result
    if mode == "lean":
        assert not UNUSED_DAEMONS & set(result["kinds"]), result
    else:  # Ray's own set, the monitor (stopped first by shutdown_ray) among them
        assert set(result["kinds"]) >= UNUSED_DAEMONS, result
    assert result["alive"] == [] and result["initialized"] is False, result
    assert result["frozen"] > 100_000, result  # the driver's heap: Ray's modules alone are more


def test_an_unknown_local_ray_mode_is_refused_naming_the_variable_before_a_sweep_writes(
        monkeypatch, tmp_path):
    from sweeps.plan.budget import build_plan_within_budget
    from sweeps.spec.loading import parse_sweep_spec
    from sweeps.tune.runner import SweepSettings, run_sweep

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("KSWEEP_LOCAL_RAY", "minimal")
    refused = r"KSWEEP_LOCAL_RAY='minimal': expected one of lean, full"
    with pytest.raises(ValueError, match=refused):
        ensure_ray(num_cpus=1)
    spec = parse_sweep_spec((ROOT / "sweeps" / "examples" / "quickstart.yaml").read_text())
    with pytest.raises(ValueError, match=refused):
        run_sweep(spec, build_plan_within_budget(spec), SweepSettings(
            sweep_id="refused", sweep_root=tmp_path / "root",
            tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}"))
    assert list(tmp_path.iterdir()) == []  # no sweep folder, no MLflow store, no parent run


def test_a_wrong_writer_process_threshold_is_refused_naming_the_variable_before_a_sweep_writes(
        monkeypatch, tmp_path):
    from sweeps.plan.budget import build_plan_within_budget
    from sweeps.spec.loading import parse_sweep_spec
    from sweeps.tune.runner import SweepSettings, run_sweep

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("KSWEEP_WRITER_PROCESS_MIN_RUNS", "eight")
    spec = parse_sweep_spec((ROOT / "sweeps" / "examples" / "quickstart.yaml").read_text())
    with pytest.raises(ValueError, match=r"KSWEEP_WRITER_PROCESS_MIN_RUNS='eight': expected a whole number"):
        run_sweep(spec, build_plan_within_budget(spec), SweepSettings(
            sweep_id="refused", sweep_root=tmp_path / "root",
            tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}"))
    assert list(tmp_path.iterdir()) == []  # no sweep folder, no MLflow store, no parent run
