"""Trial configuration: one pydantic model, every field documented where it is declared."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from objectives.options import KLOptions
from objectives.schedules import kl_schedule_overrun, ramp_overrun, total_optimizer_steps
from objectives.spec import LossStackSpec
from workers.contract import (
    SELECTABLE_METRICS,
    SELECTION_METRIC,
    SELECTION_VAL_LOSS,
    SELECTION_VAL_METRIC,
    selection_maximises,
)
from workers.data.config import DatasetDataConfig, SyntheticTaskConfig
from workers.models.config import BaseModelConfig, ModelConfig
from workers.yaml_loader import read_mapping_file


class TrainingConfig(BaseModel):
    """The recipe's knobs: optimiser, budget, device, precision."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    epochs: int = Field(
        10, ge=1, le=100_000, validation_alias=AliasChoices("epochs", "max_epochs"),
        description="The epoch budget (also accepted as `max_epochs`): training stops here, or "
        "earlier when early stopping (`patience`) ends it.",
    )
    patience: int | None = Field(
        None, ge=1, le=100_000,
        description="Early stopping on the trial's own val loss (`val/loss`, never NMI): stop "
        "after this many epochs in a row without an improvement of more than `min_delta`, once "
        "`min_epochs` have run. None: run the whole budget. Either way the checkpoint "
        "`selection` chooses is restored at the end and the `selected/...` values are read there.",
    )
    min_epochs: int = Field(
        1, ge=1, le=100_000, description="Early stopping never stops before this many epochs."
    )
    min_delta: float = Field(
        0.0, ge=0, allow_inf_nan=False,
        description="An epoch improves on the best val loss only when lower by more than this.",
    )
    selection: Literal["val_loss", "val_metric"] = Field(
        SELECTION_VAL_LOSS,
        description="How the checkpoint whose `selected/...` values are read is chosen: "
        "'val_loss', the epoch of lowest `val/loss`; 'val_metric', the best epoch of "
        "`selection_metric` (highest for a latent metric such as `val/latent_ami`, lowest for a "
        "loss). Ties: the earlier epoch. Early stopping (`patience`) reads `val/loss` either way.",
    )
    selection_metric: str | None = Field(
        None,
        description="With `selection: val_metric`: the val metric that chooses the checkpoint, "
        "e.g. `val/latent_ami` (a labelled dataset) or `val/elbo`. Must be left out with "
        "`selection: val_loss`.",
    )
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
    compile: Literal["auto", "on", "off"] = Field(
        "auto",
        description="A cohort's training step under torch.compile (static shapes: padded length "
        "buckets, stopped members masked): 'on' compiles (falling back to eager with a logged "
        "reason where it cannot), 'off' stays eager, 'auto' compiles only on devices where it "
        "measured faster (none yet: eager; docs/performance-cohorts.md). Lone trials ignore it.",
    )
    inject_nan_at_step: int | None = Field(
        None, ge=0,
        description="Testing aid: make the loss NaN at this optimisation step, to exercise the "
        "divergence handling. Leave unset.",
    )
    autoencoder_epochs: int = Field(
        0, ge=0, le=100_000,
        description="Autoencoder pre-training (Li et al. 2019), a remedy for posterior collapse: "
        "the first this-many epochs train with the KL term's weight at 0; then the KL comes in, "
        "its anneal schedule counted from there (pair it with free bits, as Li et al. do). "
        "Selection and early stopping skip these epochs. 0: off. Must be below `epochs`.",
    )
    autoencoder_reset_decoder: bool = Field(
        True,
        description="With `autoencoder_epochs`: when the KL comes in, the decoder's parameters "
        "(`decoder.*`; the shared embedding stays) go back to their initial values and their "
        "AdamW state is cleared, as Li et al. reset the decoder, so only the pre-trained "
        "inference network carries over.",
    )
    aggressive_epochs: int = Field(
        0, ge=0, le=100_000,
        description="Aggressive inference-network updates (He et al. 2019), a remedy for posterior "
        "collapse: in the first this-many epochs, each batch's update of the generative side "
        "(every parameter but the inference network's `target_encoder.*` and `posterior_head.*`) "
        "follows `aggressive_encoder_steps` updates of the inference network alone, on the next "
        "batches of the epoch. 0: off. At most `epochs`.",
    )
    aggressive_encoder_steps: int = Field(
        5, ge=1, le=1000,
        description="With `aggressive_epochs`: inference-network-only updates before each "
        "generative update (a fixed count: He et al. stop at convergence, which would need a host "
        "sync per update). An aggressive epoch costs about this plus one times a plain one; the "
        "step counter (schedules, logged losses) counts only the generative updates.",
    )

    @model_validator(mode="after")
    def _selection_metric_named(self) -> TrainingConfig:
        if self.selection == SELECTION_VAL_METRIC and self.selection_metric is None:
            raise ValueError("training.selection is 'val_metric' but training.selection_metric is "
                             "not set; name the val metric, e.g. selection_metric: val/latent_ami")
        if self.selection == SELECTION_VAL_LOSS and self.selection_metric is not None:
            raise ValueError(f"training.selection_metric ({self.selection_metric!r}) is set but "
                             "training.selection is 'val_loss'; set selection: val_metric, or "
                             "remove selection_metric")
        if self.selection_metric is not None and self.selection_metric not in SELECTABLE_METRICS:
            raise ValueError(f"training.selection_metric {self.selection_metric!r} is not a val "
                             f"metric a trial logs; use one of {', '.join(SELECTABLE_METRICS)}")
        return self

    @property
    def selection_rule(self) -> str:
        """The metric the checkpoint choice reads and its direction, e.g. ``lowest val/loss``."""
        metric = self.selection_metric or SELECTION_METRIC
        return f"{'highest' if selection_maximises(metric) else 'lowest'} {metric}"

    @model_validator(mode="after")
    def _phases_within_budget(self) -> TrainingConfig:
        if self.autoencoder_epochs >= self.epochs:
            raise ValueError(f"training.autoencoder_epochs ({self.autoencoder_epochs}) must be below "
                             f"training.epochs ({self.epochs}), or the KL never comes in; lower it or "
                             "raise epochs")
        if self.aggressive_epochs > self.epochs:
            raise ValueError(f"training.aggressive_epochs ({self.aggressive_epochs}) is more than "
                             f"training.epochs ({self.epochs}); lower it to at most {self.epochs}")
        return self


class ReadoutConfig(BaseModel):
    """What the epoch-end evaluation reads out (workers/readouts; docs/concepts/trials.md "Read-outs")."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    nmi_auc_horizon: int | None = Field(
        None, ge=1, le=100_000,
        description="Horizon H (epochs) of `{split}/nmi_auc`, the mean NMI over epochs 1..H "
        "(a curve that stopped early is padded with its last value). None: `training.epochs`. "
        "Keep it fixed across trials that are compared.",
    )
    train_subset: int = Field(
        256, ge=1, le=10_000_000,
        description="The train read-outs (but the overall losses, the running means of the "
        "epoch's steps) are computed on this many train examples, drawn once with a fixed seed "
        "(the same rows every epoch and for every trial on the same data; not the first rows, "
        "which on a table sorted by label are one class).",
    )
    gradient_batch: int = Field(
        64, ge=0, le=65_536,
        description="Val examples (the first ones, fixed) of the gradient-share read-out; 0 = off.",
    )
    test: bool = Field(
        True, description="Evaluate the test split every epoch (logged, never read by selection)."
    )
    test_every_epoch: bool = Field(
        True,
        description="With `test`: read the test split at every epoch end (its curves in MLflow). "
        "False: read it once, at the checkpoint val chose (the `selected/test/...` values the "
        "report reads, the same numbers), for a fraction of the evaluation's cost when the test "
        "split is large; the per-epoch test curves and test speed read-outs are then absent.",
    )

    def epoch_splits(self) -> tuple[str, ...]:
        """The splits every epoch end reads out."""
        return ("train", "val", "test") if self.test and self.test_every_epoch else ("train", "val")


def _data_kind(value: Any) -> str:
    """'dataset' when the data names a registered dataset, else 'synthetic' (the default)."""
    if isinstance(value, dict):
        return "dataset" if "dataset" in value else "synthetic"
    return "dataset" if isinstance(value, DatasetDataConfig) else "synthetic"


DataConfig = Annotated[
    Annotated[SyntheticTaskConfig, Tag("synthetic")] | Annotated[DatasetDataConfig, Tag("dataset")],
    Discriminator(_data_kind),
]
"""A trial's data: the synthetic task, or a registered dataset when ``dataset`` is given."""


class TrialConfig(BaseModel):
    """Everything one trial needs: data, z-free base, model, loss stack, recipe, seed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str | None = Field(None, max_length=200, description="Run name in MLflow (optional).")
    seed: int = Field(
        0, ge=0, le=2**31 - 1,
        description="Trial seed: model init, batching, sampling, and the data sample unless "
        "`data.seed` pins it (data seed = this seed).",
    )
    data: DataConfig = Field(
        default_factory=SyntheticTaskConfig,
        description="The synthetic task and its splits, or a registered dataset "
        "(`{dataset: NAME, ...}`: docs/guide/datasets-training.md).",
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
    readouts: ReadoutConfig = Field(
        default_factory=ReadoutConfig, description="The epoch-end read-outs (docs/concepts/trials.md: Read-outs)."
    )
    allow_free_bits_above_log_k: bool = Field(
        False,
        description="Accept a discrete-latent trial whose KL free_bits is >= log K. Off: such a "
        "config is rejected, because z can then carry the whole strategy (log K nats) without KL "
        "pressure and every stack recovers it for free (docs/science/index.md, rules of evidence: "
        "free bits below log K or none).",
    )

    @model_validator(mode="after")
    def _check_mutual_info_credit(self) -> TrialConfig:
        kl = self.loss_stack.resolved_terms().get("kl")
        if kl is not None and kl.options.get("mutual_info_credit") and self.model.family != "discrete":
            raise ValueError(
                "loss_stack.terms.kl.options.mutual_info_credit needs a discrete latent (its I(x; z) "
                "is the plug-in estimate of q's categories); set model.family: discrete or the credit to 0")
        return self

    @model_validator(mode="after")
    def _check_free_bits(self) -> TrialConfig:
        kl = self.loss_stack.resolved_terms().get("kl")
        if kl is None or self.model.family != "discrete" or self.allow_free_bits_above_log_k:
            return self
        free_bits = float(kl.options.get("free_bits", 0.0))
        k = self.model.num_categories or getattr(self.data, "num_strategies", None)
        if k is None:  # a dataset: K is its label count, known once it is read (Trainer.create)
            return self
        if free_bits >= math.log(k):
            raise ValueError(
                f"loss_stack.terms.kl.options.free_bits ({free_bits:g}) must be below log K = "
                f"{math.log(k):.4g} nats (K = {k} latent categories), or KL puts no pressure on z; "
                "lower it (or 0 for none), or set allow_free_bits_above_log_k: true"
            )
        return self

    def resolved_data(self) -> SyntheticTaskConfig | DatasetDataConfig:
        """The task with its seed resolved: ``data.seed``, or the trial seed when unset (a
        dataset is returned as it is: its split seed is its own)."""
        if isinstance(self.data, DatasetDataConfig) or self.data.seed is not None:
            return self.data
        return self.data.model_copy(update={"seed": self.seed})

    @property
    def alpha(self) -> float:
        """The concentration knob of the loss stack."""
        return self.loss_stack.alpha

    def total_steps(self, train_rows: int) -> int:
        """The run's optimizer steps on ``train_rows`` examples: epochs x ceil(rows / batch_size)."""
        return total_optimizer_steps(self.training.epochs, train_rows, self.training.batch_size)

    def schedule_overruns(self, total_steps: int) -> list[str]:
        """The schedules that do not finish within a run of ``total_steps`` optimizer steps, in
        words (:mod:`objectives.schedules`): the KL annealing (a kl term of weight > 0), and the
        Gumbel temperature decay of a discrete latent trained with the gumbel estimator."""
        overruns = []
        kl = self.loss_stack.resolved_terms().get("kl")
        if kl is not None and kl.weight > 0:
            overruns.append(kl_schedule_overrun(KLOptions.model_validate(kl.options), total_steps))
        model = self.model
        if model.family == "discrete" and model.discrete_estimator == "gumbel":
            overruns.append(ramp_overrun("Gumbel temperature decay",
                                         model.gumbel_decay_steps(total_steps), total_steps))
        return [words for words in overruns if words is not None]

    def summary_params(self) -> dict[str, Any]:
        """The params every trial run carries by name (docs/concepts/design.md), besides the flattened config."""
        return {
            "alpha": self.loss_stack.alpha,
            "loss_stack": self.loss_stack.label,
            "model": self.model.family,
            "seed": self.seed,
        }


def load_trial_config(path: str | Path) -> TrialConfig:
    """Load a TrialConfig from a YAML 1.2 or JSON file (unknown fields are rejected).

    An empty file is the default config. Raises ``workers.yaml_loader.SpecFileError`` (a
    ``ValueError``) for a file too large, not YAML/JSON or not a mapping.
    """
    return TrialConfig.model_validate(read_mapping_file(path, what="a trial config", empty=True))
