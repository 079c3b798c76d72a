"""The training recipe: trial configuration, the loop, checkpoints.

Names load on first use (``lazy_loader``), so ``workers.train.config`` imports without torch.
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(__name__, submod_attrs={
    "config": ["ReadoutConfig", "TrainingConfig", "TrialConfig", "load_trial_config"],
    "loop": ["Trainer", "TrialCheckFailed", "TrialDiverged"],
    "state": ["resolve_device", "seed_everything"],
})
