"""A driver process ends at once: its local Ray stopped whole, monitor included, and no final
garbage collection (``sweeps.tune.setup.end_driver_process``)."""

import json
import subprocess
import sys
from pathlib import Path

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


def test_end_driver_process_stops_every_ray_process_and_freezes_the_heap():
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin",
                                            "RAY_prestart_worker_first_driver": "0"})
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"gcs_server", "raylet", "monitor"} <= set(result["kinds"]), result
    assert result["alive"] == [] and result["initialized"] is False, result
    assert result["frozen"] > 100_000, result  # the driver's heap: Ray's modules alone are more
