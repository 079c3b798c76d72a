"""The training recipe: trial configuration, the loop, checkpoints."""

from workers.train.config import ReadoutConfig, TrainingConfig, TrialConfig, load_trial_config
from workers.train.loop import (
    Trainer,
    TrialCheckFailed,
    TrialDiverged,
    resolve_device,
    seed_everything,
)

__all__ = [
    "Trainer",
    "ReadoutConfig",
    "TrainingConfig",
    "TrialCheckFailed",
    "TrialConfig",
    "TrialDiverged",
    "load_trial_config",
    "resolve_device",
    "seed_everything",
]
