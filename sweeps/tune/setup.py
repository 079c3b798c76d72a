"""Ray and Tune set-up for a sweep: the cluster connection, the search space, searcher,
scheduler and the Tuner (new, or restored from the sweep's Tune state).

Tune reads a few knobs only from the driver process's environment;
:data:`service.orchestrator.driver_env.TUNE_ENV` lists them, and whoever starts a driver process passes
them (the launchers put them in the driver's environment, ``ksweep sweep run`` sets them
as it starts). Nothing here writes ``os.environ``.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ray
from ray import tune
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

from sweeps.plan.build import SweepPlan
from sweeps.settings import driver_settings
from sweeps.spec import SweepSpec
from sweeps.tune.search_space import param_space
from sweeps.tune.state_backup import fill_deleted_checkpoints, repair_experiment_state

TUNE_FOLDER = "tune"


def local_ray_mode() -> str:
    """``KSWEEP_LOCAL_RAY`` (default ``lean``; ``full`` keeps every process Ray's own
    ``ray.init`` starts), checked: a ValueError naming the variable else."""
    return driver_settings().local_ray


def ensure_ray(num_cpus: int | None = None, address: str | None = None) -> None:
    """Connect to RAY_ADDRESS / ``address``, or start a local Ray of its own sized with
    ``num_cpus``, whatever other Ray runs on the machine (without its unused daemons unless
    ``KSWEEP_LOCAL_RAY=full``: :func:`_without_unused_daemons`)."""
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        ray.init(address=address, log_to_driver=False)
        return
    # "local": a new Ray of its own. Without an address, ray.init would join the Ray that
    # `ray start` last recorded on this machine (a dead one too) and refuse num_cpus.
    with _without_unused_daemons() if local_ray_mode() == "lean" else contextlib.nullcontext():
        ray.init(address="local", num_cpus=num_cpus or os.cpu_count() or 1, include_dashboard=False,
                 log_to_driver=False, configure_logging=False)


@contextlib.contextmanager
def _without_unused_daemons() -> Iterator[None]:
    """While a local Ray starts, leave out three of its processes a one-node sweep never uses:
    the autoscaler monitor (nothing to scale), the log monitor (the driver forwards no worker
    logs, ``log_to_driver=False``) and the API server (no dashboard, Jobs or state API is
    asked of a sweep's own Ray). They cost about 3 CPU-s and 3 s of wall per sweep
    (docs/performance.md). ``ray.init`` has no switch for them, so Ray's private start-up hooks
    are set for the call; a Ray without these hooks starts everything as before.
    """
    try:
        from ray._private import node, parameter
        params_init = parameter.RayParams.__init__
        start_api_server = node.Node.start_api_server
    except (ImportError, AttributeError):
        yield
        return

    def lean_params(self: Any, *args: Any, **kwargs: Any) -> None:
        params_init(self, *args, **kwargs)
        self.no_monitor = True
        self.include_log_monitor = False

    def no_api_server(self: Any, **kwargs: Any) -> None:
        return None

    parameter.RayParams.__init__ = lean_params  # type: ignore[method-assign]
    node.Node.start_api_server = no_api_server  # type: ignore[method-assign]
    try:
        yield
    finally:
        parameter.RayParams.__init__ = params_init  # type: ignore[method-assign]
        node.Node.start_api_server = start_api_server  # type: ignore[method-assign]


def shutdown_ray() -> None:
    """Disconnect from Ray now, stopping a local Ray this process started.

    Ray's exit hook would do it too, but it first sleeps 0.5 s for log lines a driver here
    does not forward (``log_to_driver=False``), and then a local Ray's autoscaler monitor
    waits out its whole 1 s SIGTERM grace (its handler reports to the GCS, stopped just
    before). A one-node Ray's monitor keeps nothing, so it is killed first.
    """
    # Ray's private node handle, set where this process started the Ray; a Ray without it or
    # without its kill_monitor only shuts down slower.
    node = getattr(ray._private.worker, "_global_node", None)
    if node is not None and node.is_head():
        with contextlib.suppress(Exception):
            node.kill_monitor(check_alive=False)
    ray.shutdown()


def end_driver_process() -> None:
    """The end of a driver process: Ray shut down now (:func:`shutdown_ray`), then the
    interpreter's final garbage collection skipped: over the heap Ray, Tune and MLflow leave
    it takes about 1 s and frees nothing the process's exit does not."""
    shutdown_ray()
    gc.freeze()


def _search_alg(spec: SweepSpec, plan: SweepPlan):
    if spec.search.kind != "optuna":
        return None
    import optuna
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.optuna import OptunaSearch

    seed = spec.search.seed
    sampler = {
        "tpe": lambda: optuna.samplers.TPESampler(seed=seed),
        "cmaes": lambda: optuna.samplers.CmaEsSampler(seed=seed),
        "nsga2": lambda: optuna.samplers.NSGAIISampler(seed=seed),
    }[spec.search.sampler]()
    metrics, modes = spec.objective.metrics, spec.objective_modes()
    multi = len(metrics) > 1
    searcher = OptunaSearch(
        metric=list(metrics) if multi else metrics[0], mode=list(modes) if multi else modes[0],
        sampler=sampler, seed=seed,
    )
    limit = spec.budget.max_concurrent_trials or plan.trial_count
    return ConcurrencyLimiter(searcher, max_concurrent=max(1, limit))


def _scheduler(spec: SweepSpec):
    if spec.scheduler.kind == "asha":
        return ASHAScheduler(
            time_attr="training_iteration", metric=spec.primary_metric, mode=spec.primary_mode,
            max_t=spec.scheduler.max_t or spec.template.training.epochs,
            grace_period=spec.scheduler.grace_period, reduction_factor=spec.scheduler.reduction_factor,
        )
    return FIFOScheduler()


def make_tuner(spec: SweepSpec, plan: SweepPlan, trainable: Any, run_config: tune.RunConfig,
               tune_path: Path) -> tune.Tuner:
    """The sweep's Tuner: restored from ``tune_path`` when a driver ran before (finished
    trials are not re-run, unfinished ones resume from their checkpoints), else new."""
    repair_experiment_state(tune_path)  # a kill mid-save must not restart the sweep afresh
    fill_deleted_checkpoints(tune_path)  # nor fail a trial whose named checkpoint Tune deleted
    if tune.Tuner.can_restore(str(tune_path)):
        # The param space again: a grid trial created but not started before the kill keeps
        # placeholders for its sample_from params, which only the original space resolves.
        return tune.Tuner.restore(str(tune_path), trainable=trainable, resume_unfinished=True,
                                  resume_errored=False, restart_errored=False,
                                  param_space=param_space(spec, plan))
    multi = len(spec.objective.metrics) > 1
    single_metric = not multi and spec.search.kind != "optuna"
    return tune.Tuner(
        trainable,
        param_space=param_space(spec, plan),
        tune_config=tune.TuneConfig(
            metric=spec.primary_metric if single_metric else None,
            mode=spec.primary_mode if single_metric else None,
            search_alg=_search_alg(spec, plan), scheduler=_scheduler(spec),
            num_samples=spec.search.num_samples if spec.search.kind == "optuna" else 1,
            max_concurrent_trials=spec.budget.max_concurrent_trials,
            # A slot's next trial runs in the finished one's process: its ~4-10 s of imports
            # and first-trial set-up are paid once per slot. Safe across a kill -9: a trial
            # Tune restores after its run FINISHED touches nothing (sweeps/tune/trainable.py).
            reuse_actors=True,
            time_budget_s=spec.budget.time_budget_s,
        ),
        run_config=run_config,
    )
