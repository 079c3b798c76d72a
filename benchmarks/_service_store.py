"""The seeded store of the service benchmark: 1,000 sweeps and 10,000 trials, written through
SQLAlchemy (see :mod:`benchmarks.bench_service`)."""

from __future__ import annotations

import json
import random
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import insert

from service.store.db import SweepRow, TrialRow
from service.store.queries import Store
from sweeps.plan.build import build_plan
from sweeps.report.build import TrialOutcome, build_report
from sweeps.spec import SweepSpec, load_sweep_spec
from workers.contract import METRIC_NAMES

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "sweeps" / "examples" / "quickstart.yaml"
N_SWEEPS = 1_000
TRIALS_PER_SWEEP = 10
TOKENS = {"alice": "alice-token", "bob": "bob-token", "carol": "carol-token", "admin": "admin-token"}
STATE_WEIGHTS = {"succeeded": 0.60, "cancelled": 0.20, "failed": 0.15, "queued": 0.05}
SEED = 20240611


# ---- the store --------------------------------------------------------------------------------


def stored_spec() -> dict[str, Any]:
    """The quickstart spec with alphas {0, 0.5, 1, 1.5, 2} (10 trials), as the API stores it."""
    data = load_sweep_spec(QUICKSTART).model_dump(mode="json")
    data.update(alpha=[0.0, 0.5, 1.0, 1.5, 2.0], loss_stacks=["ncc", "raw_plus_ncc"], seeds=1)
    spec = SweepSpec.model_validate(data)
    assert build_plan(spec).trial_count == TRIALS_PER_SWEEP
    return json.loads(spec.canonical_json())


def _metrics(rng: random.Random, alpha: float) -> dict[str, float]:
    values = {name: round(rng.uniform(0.05, 3.0), 6) for name in METRIC_NAMES}
    values["val/latent_nmi"] = round(min(1.0, rng.uniform(0.2, 0.7) + 0.1 * alpha), 6)
    values["val/latent_ari"] = round(rng.uniform(0.1, 0.9), 6)
    values["val/active_units"] = float(rng.randint(1, 8))
    return values


def _sweep_rows(spec: dict[str, Any], rng: random.Random) -> tuple[list[dict], list[dict]]:
    now = datetime.now(UTC)
    owners = [owner for owner in TOKENS if owner != "admin"]
    states, weights = zip(*STATE_WEIGHTS.items(), strict=True)
    grid = [(alpha, stack) for alpha in spec["alpha"] for stack in spec["loss_stacks"]]
    sweeps: list[dict] = []
    trials: list[dict] = []
    for _ in range(N_SWEEPS):
        sweep_id = f"{rng.getrandbits(48):012x}"
        state = rng.choices(states, weights)[0]
        created = now - timedelta(seconds=rng.uniform(0, 90 * 86400))
        started = created + timedelta(seconds=rng.uniform(1, 600)) if state != "queued" else None
        finished = started + timedelta(seconds=rng.uniform(60, 3600)) if started else None
        prefix = f"{rng.getrandbits(20):05x}"
        outcomes: list[TrialOutcome] = []
        for position, (alpha, stack) in enumerate(grid):
            if state == "queued":
                trial_state = "pending"
            elif state == "cancelled":
                trial_state = "done" if position < 4 else "pending"
            elif state == "failed":
                trial_state = "failed" if position % 3 == 2 else "done"
            else:
                trial_state = "stopped" if position == 9 else "done"
            config = {"alpha": alpha, "loss_stack": stack, "model": "discrete", "seed": 0}
            metrics = _metrics(rng, alpha) if trial_state in ("done", "stopped") else {}
            trial_id = f"{prefix}_{position:05d}"
            run_id = uuid.UUID(int=rng.getrandbits(128)).hex if trial_state != "pending" else None
            error = "RuntimeError: loss is NaN at epoch 3" if trial_state == "failed" else None
            epochs = 6 if trial_state == "done" else 3 if metrics else 0
            trials.append({
                "sweep_id": sweep_id, "trial_id": trial_id, "position": position,
                "state": trial_state, "config": config, "metrics": metrics, "epochs": epochs,
                "mlflow_run_id": run_id, "error": error,
                "updated_at": finished or created,
            })
            outcomes.append(TrialOutcome(trial_id=trial_id, params=config, state=trial_state,
                                         final=metrics, history={}, epochs=epochs, error=error,
                                         run_id=run_id))
        counts = {name: sum(o.state == name for o in outcomes)
                  for name in ("pending", "running", "done", "failed", "stopped")}
        scored = [o for o in outcomes if o.final]
        best = max(scored, key=lambda o: o.final["val/latent_nmi"]) if scored else None
        report = None
        if state in ("succeeded", "failed"):
            report = build_report(SweepSpec.model_validate(spec), sweep_id, outcomes)
        sweeps.append({
            "id": sweep_id, "name": spec["name"], "owner": rng.choice(owners), "state": state,
            "spec": spec, "request_hash": f"{rng.getrandbits(256):064x}", "idempotency_key": None,
            "created_at": created, "started_at": started, "finished_at": finished,
            "updated_at": finished or created, "total": TRIALS_PER_SWEEP, **counts,
            "best_metric": "val/latent_nmi" if best else None,
            "best_value": best.final["val/latent_nmi"] if best else None,
            "best_trial": best.trial_id if best else None,
            "best_config": best.params if best else None,
            "eta_seconds": 0.0 if state != "queued" else None,
            "error": "2 trials failed: RuntimeError: loss is NaN" if state == "failed" else None,
            "experiment_id": str(rng.randint(1, 50)) if started else None,
            "parent_run_id": uuid.UUID(int=rng.getrandbits(128)).hex if started else None,
            "report": report, "launcher": "local" if started else None,
            "driver_handle": f"pid:{rng.randint(1000, 99999)}@bench" if started else None,
            "attempts": 1 if started else 0, "heartbeat_at": finished,
        })
    return sweeps, trials


def seed_store(url: str, rng: random.Random) -> list[str]:
    """Fill the store at ``url`` (migrated here) with the sweeps and trials; their ids."""
    store = Store(url)
    sweeps, trials = _sweep_rows(stored_spec(), rng)
    with store.session.begin() as session:
        session.execute(insert(SweepRow), sweeps)
        session.execute(insert(TrialRow), trials)
    store.close()
    return [row["id"] for row in sweeps]


