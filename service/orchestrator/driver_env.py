"""The environment of a sweep's driver process, set before Ray is imported: Tune reads its
knobs only from there, and a local Ray started by the driver listens on loopback only.

Whoever starts a driver (the launchers, ``ksweep sweep run``, the sweep benchmark) sets these;
a value already in the environment wins. Pure Python, so the CLI imports it at start-up.
"""

from __future__ import annotations

__all__ = ["LOCAL_RAY_ENV", "TUNE_ENV"]

TUNE_ENV: dict[str, str] = {
    # Small sweeps: save the experiment state often, so a killed driver resumes close to
    # where it was.
    "TUNE_GLOBAL_CHECKPOINT_S": "2",
    # Trials keep the driver's working directory (every path they get is absolute anyway).
    "RAY_CHDIR_TO_TRIAL_DIR": "0",
    # Per-epoch checkpoints of short trials force frequent state snapshots by design.
    "TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S": "0",
    # Reused actors (reuse_actors=True): Tune waits this long for a stopped trial's thread
    # to end (its run finished, PNGs logged) before handing the actor to the next trial;
    # past it the next trial fails. Tune's default is 2 s, less than PNGs take under load.
    "TUNE_FUNCTION_THREAD_TIMEOUT_S": "120",
    # No TensorBoard event files (they would load torch into the driver through tensorboardX);
    # the sweep adds the CSV and JSON loggers its results are read from itself.
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",
}

# The environment of a process that starts its own local Ray, set before Ray is imported.
# A value already in the environment wins.
LOCAL_RAY_ENV: dict[str, str] = {
    # Ray 2.60's ray.init turns a node IP of 127.0.0.1 into the host's address and binds its
    # gRPC servers to every interface, unless cluster mode is off (Ray's switch for macOS and
    # Windows); then GCS, raylet, workers and agents listen on loopback only
    # (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1 opts out).
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    # No workers prestarted for the driver: Ray starts one per trial actor when it is needed,
    # and a prestarted worker no actor takes idles to the end, its imports spent for nothing.
    "RAY_prestart_worker_first_driver": "0",
}
