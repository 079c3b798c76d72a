"""Trial configuration: one pydantic model, every field documented where it is declared."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from objectives.spec import LossStackSpec
from workers.data.config import SyntheticTaskConfig
from workers.models.config import BaseModelConfig, ModelConfig


class TrainingConfig(BaseModel):
    """The recipe's knobs: optimiser, budget, device, precision."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    epochs: int = Field(10, ge=1, le=100_000, description="Passes over the train split.")
    batch_size: int = Field(64, ge=1, le=65_536, description="Examples per optimisation step.")
    eval_batch_size: int = Field(512, ge=1, le=65_536, description="Examples per evaluation batch.")
    learning_rate: float = Field(3e-3, gt=0, le=10, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0, le=10, description="AdamW decoupled weight decay.")
    grad_clip: float | None = Field(
        1.0, gt=0, description="Max global gradient norm (None = no clipping)."
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="'auto' = cuda when available, else cpu."
    )
    bf16: bool = Field(
        False, description="bf16 autocast for the model's forward pass on CUDA (ignored on CPU)."
    )
    num_threads: int | None = Field(
        1, ge=1, le=1024,
        description="torch intra-op threads on CPU. The default 1 is fastest for these small GRUs "
        "(more threads spin against each other, worst beside other trials); None keeps torch's "
        "default.",
    )
    inject_nan_at_step: int | None = Field(
        None, ge=0,
        description="Testing aid: make the loss NaN at this optimisation step, to exercise the "
        "divergence handling. Leave unset.",
    )


class TrialConfig(BaseModel):
    """Everything one trial needs: data, z-free base, model, loss stack, recipe, seed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str | None = Field(None, max_length=200, description="Run name in MLflow (optional).")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Trial seed: model init, batching, sampling.")
    data: SyntheticTaskConfig = Field(
        default_factory=SyntheticTaskConfig, description="The synthetic task and its splits."
    )
    base: BaseModelConfig = Field(
        default_factory=BaseModelConfig, description="The z-free base model giving b_t."
    )
    model: ModelConfig = Field(default_factory=ModelConfig, description="The CVAE.")
    loss_stack: LossStackSpec = Field(
        default_factory=lambda: LossStackSpec(preset="raw_plus_ncc", terms={"kl": 0.1}),
        description="The training objective (alpha lives here). c_base is measured, not set.",
    )
    training: TrainingConfig = Field(default_factory=TrainingConfig, description="The recipe.")

    @property
    def alpha(self) -> float:
        """The concentration knob of the loss stack."""
        return self.loss_stack.alpha

    def summary_params(self) -> dict[str, Any]:
        """The params every trial run carries by name (DESIGN.md), besides the flattened config."""
        return {
            "alpha": self.loss_stack.alpha,
            "loss_stack": self.loss_stack.label,
            "model": self.model.family,
            "seed": self.seed,
        }


def load_trial_config(path: str | Path) -> TrialConfig:
    """Load a TrialConfig from a YAML or JSON file (unknown fields are rejected)."""
    text = Path(path).read_text()
    data = yaml.safe_load(text) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a trial config must be a mapping, got {type(data).__name__}")
    return TrialConfig.model_validate(data)
