"""A trial's state: where it runs, its seeds, and what its checkpoint holds to resume mid-trial.

A checkpoint holds the model, the optimiser, the counters, the history, the early-stopping
rule, the target-rate control's multiplier and every RNG stream (python, numpy, torch, CUDA, the batch order), with the trial's
config: a checkpoint of another config is refused. It is written to a temporary file and
renamed, so a crash never leaves half a checkpoint.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["load_trainer_state", "resolve_device", "save_state", "seed_everything", "trainer_state"]


def resolve_device(name: str) -> torch.device:
    """'auto' -> cuda when available, else cpu; 'cuda' without CUDA raises ValueError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("training.device is 'cuda' but CUDA is not available; use 'auto' or 'cpu'")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def trainer_state(trainer: Any) -> dict[str, Any]:
    """A :class:`~workers.train.loop.Trainer`'s model, optimiser, counters, history, KL multiplier
    and every RNG state (module doc)."""
    generator = trainer.batch_generator
    return {
        "model": trainer.model.state_dict(),
        "optimizer": trainer.optimizer.state_dict(),
        "epoch": trainer.epoch,
        "step": trainer.step,
        "history": trainer.history,
        "selection": trainer.selection.state_dict(),
        "config": trainer.config.model_dump(mode="json"),
        "rate_control": trainer.rate_control.state_dict() if trainer.rate_control is not None else None,
        "rng": {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "batching": generator.get_state() if generator else None,
        },
    }


def load_trainer_state(trainer: Any, state: dict[str, Any]) -> None:
    """Restore a state written by :func:`trainer_state` (the config must match)."""
    if state["config"] != trainer.config.model_dump(mode="json"):
        raise ValueError("checkpoint was written by a different trial config; refusing to resume")
    trainer.model.load_state_dict(state["model"])
    trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.epoch, trainer.step, trainer.history = state["epoch"], state["step"], state["history"]
    if "selection" in state:
        trainer.selection.load_state_dict(state["selection"])
    if trainer.rate_control is not None and state.get("rate_control") is not None:
        trainer.rate_control.load_state_dict(state["rate_control"])  # the beta it had reached
    rng = state["rng"]
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    if rng["batching"] is not None and trainer.batch_generator is not None:
        trainer.batch_generator.set_state(rng["batching"])


def save_state(state: dict[str, Any], path: Path | str) -> Path:
    """Write ``state`` atomically to the file ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(path.name + ".tmp")
    torch.save(state, staging)
    staging.replace(path)
    return path
