"""What makes two trials the same: the objective key within a sweep, the content hash across sweeps.

The objective key ``(objective signature, model, seed)`` is the plan's dedup key; the runner and
the report match trials to rows by it, never by a plan index, so an extension finds the trials
a sweep already has. The content hash covers everything that determines a trial's result (the
resolved objective, model, data and split, base, recipe, read-outs, seed) and the environment
it trains in (torch version, device type, precision, a digest of the training code with
:data:`TRAINING_COMPAT_VERSION`); trial runs carry it as a tag, and ``reuse`` finds finished
trials of earlier sweeps by it. Torch-free: the torch version is read from package metadata.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sweeps.plan.equivalence import objective_signature
from sweeps.spec import SweepSpec
from sweeps.spec.checks import KL_AXES
from workers.contract import TRAINING_COMPAT_VERSION

__all__ = ["NOT_TRAINING_CODE", "TRAINING_CODE", "TRIAL_HASH", "TrainingEnvironment", "code_digest",
           "hash_trials", "hashed_content", "objective_key", "training_code_files", "trial_hash",
           "trial_identity", "training_environment"]

TRIAL_HASH = "trial_hash"
"""The param (and so the ``ksweep.trial_hash`` run tag) a hashed trial carries."""
TRAINING_CODE: tuple[str, ...] = ("objectives", "workers")
"""The packages whose ``*.py`` files the code digest reads: the objective library and
everything a trial runs (data, bases, models, trainers, optimizer, read-outs)."""
NOT_TRAINING_CODE: tuple[str, ...] = ("workers/tracking",)
"""Folders the digest leaves out: where a trial writes its logs changes none of its values."""


@dataclass(frozen=True)
class TrainingEnvironment:
    """The part of a trial's identity that is not in its configuration."""

    torch_version: str
    device_type: str  # cpu | cuda
    precision: str  # float32 | bf16
    code_digest: str
    compat_version: int


def _package_folder(package: str) -> Path:
    found = importlib.util.find_spec(package)  # the folder, without importing the package
    if found is None or not found.submodule_search_locations:
        raise LookupError(f"package {package!r} not found")
    return Path(next(iter(found.submodule_search_locations)))


def training_code_files() -> dict[str, Path]:
    """The files the code digest reads, by their path from the project root, in path order."""
    skipped = tuple(f"{folder}/" for folder in NOT_TRAINING_CODE)
    files: dict[str, Path] = {}
    for package in TRAINING_CODE:
        root = _package_folder(package)
        for path in sorted(root.rglob("*.py")):
            name = f"{package}/{path.relative_to(root).as_posix()}"
            if not name.startswith(skipped):
                files[name] = path
    return files


@functools.cache
def code_digest() -> str:
    """sha256 over the training code's files (relative path and content, in path order)."""
    digest = hashlib.sha256()
    for name, path in training_code_files().items():
        digest.update(f"{name}\0".encode())
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def _torch_version() -> str:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def training_environment(spec: SweepSpec) -> TrainingEnvironment:
    """The environment this process would train ``spec``'s trials in: a trial reserves a GPU
    only with ``resources.gpu > 0`` (Ray hides the devices otherwise), and bf16 autocast
    applies on CUDA only."""
    training = spec.template.training
    cuda = spec.resources.gpu > 0 and training.device != "cpu"
    return TrainingEnvironment(
        torch_version=_torch_version(), device_type="cuda" if cuda else "cpu",
        precision="bf16" if cuda and training.bf16 else "float32",
        code_digest=code_digest(), compat_version=TRAINING_COMPAT_VERSION)


def _number(value: Any) -> float | None:
    number = None if value in (None, "", "None") else float(value)
    return None if number is None or math.isnan(number) else number  # NaN: off (target_rate)


def _point(params: Mapping[str, Any]) -> dict[str, Any]:
    """A trial's params as numbers (a run's ``ksweep.*`` tags hold them as text)."""
    return {"alpha": float(params["alpha"]), "loss_stack": str(params["loss_stack"]),
            "model": str(params["model"]), "seed": int(params["seed"]),
            **{axis: _number(params.get(axis)) for axis in KL_AXES}}


def objective_key(spec: SweepSpec, params: Mapping[str, Any]) -> tuple[str, str, int]:
    """``(objective signature, model, seed)`` of a trial's params (a plan row or trial, Tune's
    config, or a run's ``ksweep.*`` tags: numbers may come as text)."""
    point = _point(params)
    stack = spec.stack_spec(point["loss_stack"], point["alpha"], *(point[axis] for axis in KL_AXES))
    return objective_signature(stack), point["model"], point["seed"]


def trial_identity(spec: SweepSpec, params: Mapping[str, Any]) -> tuple:
    """What makes a trial of ``spec`` the one its rows name: the objective key where the plan
    deduplicates (a grid with ``search.dedup``), else every axis (each row its own trial)."""
    if spec.search.kind == "grid" and spec.search.dedup:
        return objective_key(spec, params)
    point = _point(params)
    return tuple(point[axis] for axis in ("alpha", "loss_stack", "model", "seed", *KL_AXES))


def hashed_content(spec: SweepSpec, params: Mapping[str, Any],
                   environment: TrainingEnvironment) -> dict[str, Any]:
    """What :func:`trial_hash` hashes, as a JSON-ready dict (for tests and curious readers).

    The trial's configuration without its run name and loss stack (the stack enters as its
    objective signature, so rows deduplicated into one trial hash alike) and without the
    stores' local paths; a dataset adds the hash of its split assignment (the dataset's hash
    with the fractions and seed of a split by fractions).
    """
    signature, _, _ = objective_key(spec, params)
    config = spec.trial_config_for(_point(params))
    content = config.model_dump(mode="json", exclude={"name", "loss_stack"})
    data, base = content["data"], content["base"]
    data.pop("root", None)
    base.pop("model_root", None)
    if "dataset" in data:
        split = {"dataset_sha256": data.get("sha256"), "fractions": data.get("split_fractions"),
                 "seed": data.get("split_seed")}
        data["split_assignment_sha256"] = _sha256(split)
    return {"objective": json.loads(signature), "config": content,
            "environment": asdict(environment)}


def _sha256(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def trial_hash(spec: SweepSpec, params: Mapping[str, Any],
               environment: TrainingEnvironment) -> str:
    """The content hash of the trial ``params`` names in ``spec`` (sha256, hex)."""
    return _sha256(hashed_content(spec, params, environment))


def hash_trials(spec: SweepSpec, trials: list[dict[str, Any]],
                environment: TrainingEnvironment) -> None:
    """Give every trial (a plan's) its :data:`TRIAL_HASH`; an Optuna plan's trials hold
    distributions ("U[0, 4]"), not values, so they get none (Optuna sweeps neither grow nor reuse)."""
    if spec.search.kind == "optuna":
        return
    for trial in trials:
        trial[TRIAL_HASH] = trial_hash(spec, trial, environment)
