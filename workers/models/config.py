"""Model configuration shared by the CVAE families and the learned z-free base model."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from objectives.schedules import fraction_of_run
from workers.contract import SHA256_HEX_PATTERN

DEFAULT_GUMBEL_ANNEAL_STEPS = 2000


class ModelConfig(BaseModel):
    """Sizes and latent family of the CVAE. Every field is a sweepable hyperparameter."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    family: Literal["discrete", "continuous"] = Field(
        "discrete",
        description="Latent family: 'discrete' (K-way categorical z) or 'continuous' (diagonal "
        "Gaussian z, reparameterised).",
    )
    embedding_dim: int = Field(32, ge=1, le=4096, description="Token embedding width.")
    hidden_dim: int = Field(64, ge=1, le=8192, description="GRU hidden width (all GRUs).")
    num_layers: int = Field(1, ge=1, le=8, description="GRU layers in each encoder/decoder.")
    dropout: float = Field(
        0.0, ge=0, lt=1, description="Dropout on embeddings and between GRU layers."
    )
    word_dropout: float = Field(
        0.0, ge=0, le=1, allow_inf_nan=False,
        description="Word dropout (Bowman et al. 2016): in training only, each decoder input "
        "after BOS is replaced by UNK with this probability, so the decoder must lean on z "
        "rather than on the words before. UNK is an input-only embedding row of the decoder, "
        "learned from zeros; no vocabulary id changes, and 0 (off) builds no such row. Never "
        "applied at evaluation. A remedy for posterior collapse (docs/concepts/trials.md).",
    )
    num_categories: int | None = Field(
        None,
        ge=2,
        le=1024,
        description="K of the discrete latent. Unset: the task's number of strategies, so that "
        "latent recovery (NMI/ARI) compares like with like.",
    )
    latent_dim: int = Field(
        8, ge=1, le=1024, description="Dimension of the continuous latent; the discrete latent's "
        "category embedding has this width too."
    )
    discrete_estimator: Literal["enumerate", "gumbel"] = Field(
        "enumerate",
        description="'enumerate': exact expectation over the K values in the ELBO (K decoder "
        "passes). 'gumbel': one straight-through Gumbel-softmax sample per example.",
    )
    gumbel_temperature_start: float = Field(1.0, gt=0, description="Gumbel temperature at step 0.")
    gumbel_temperature_end: float = Field(0.3, gt=0, description="Gumbel temperature after annealing.")
    gumbel_anneal_steps: int | None = Field(
        None, ge=1,
        description=f"Optimizer steps of exponential decay from the start to the end temperature. "
        f"Unset: {DEFAULT_GUMBEL_ANNEAL_STEPS}, or `gumbel_anneal_fraction` of the run when that "
        "is set (not both).",
    )
    gumbel_anneal_fraction: float | None = Field(
        None, gt=0, le=1, allow_inf_nan=False,
        description="The decay's length as a fraction of the trial's total optimizer steps "
        "(epochs x ceil(train rows / batch_size)), rounded to the nearest step (at least 1). "
        "Instead of `gumbel_anneal_steps`.",
    )
    target_encoder: Literal["forward", "bidirectional"] = Field(
        "forward",
        description="How q(z | x, y) reads y: 'forward', a GRU's state at y's last token; "
        "'bidirectional', that state beside a second GRU's after reading y backwards, so the "
        "posterior sees y's first tokens as directly as its last (a forward GRU's final state may "
        "have forgotten them over a long y).",
    )
    prior: Literal["learned", "standard"] = Field(
        "learned",
        description="'learned': p(z | x) from the context encoder. 'standard': uniform categorical "
        "or N(0, I), independent of x.",
    )

    @model_validator(mode="after")
    def _steps_or_fraction(self) -> ModelConfig:
        if self.gumbel_anneal_steps is not None and self.gumbel_anneal_fraction is not None:
            raise ValueError("set gumbel_anneal_steps (absolute optimizer steps) or "
                             "gumbel_anneal_fraction (relative to the trial's run), not both; "
                             "remove one of them")
        return self

    def gumbel_decay_steps(self, total_steps: int | None = None) -> int:
        """The temperature decay's length in steps (``total_steps``: the run's, needed by
        ``gumbel_anneal_fraction``)."""
        if self.gumbel_anneal_fraction is not None:
            return fraction_of_run(self.gumbel_anneal_fraction, total_steps, "gumbel_anneal_fraction")
        return self.gumbel_anneal_steps or DEFAULT_GUMBEL_ANNEAL_STEPS


class BaseModelConfig(BaseModel):
    """Which z-free model provides b_t, and how the learned one is trained."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["oracle", "learned", "precomputed", "causal_lm"] = Field(
        "oracle",
        description="'oracle': the exact z-free model of the generator (marginalises the "
        "strategy; synthetic task only). 'learned': an autoregressive decoder trained without z "
        "on the train split, cached on disk. 'precomputed': a dataset's `base_nll` column. "
        "'causal_lm': a registered language model (`model`), on a dataset tokenized by its "
        "tokenizer; b_t cached per (dataset hash, model hash).",
    )
    model: str | None = Field(
        None, description="causal_lm: the registered model's name (`ksweep model list`)."
    )
    model_sha256: str | None = Field(
        None, pattern=f"^{SHA256_HEX_PATTERN}$",
        description="causal_lm: pin the model's content; set when the sweep starts otherwise.",
    )
    model_root: str | None = Field(
        None, description="causal_lm: the model store, set when the sweep starts (not in specs).",
    )
    max_batch_tokens: int = Field(
        2048, ge=1, le=1_048_576,
        description="causal_lm: padded tokens per forward pass when b_t is computed.",
    )
    embedding_dim: int = Field(32, ge=1, le=4096, description="Learned base: embedding width.")
    hidden_dim: int = Field(64, ge=1, le=8192, description="Learned base: GRU width.")
    num_layers: int = Field(1, ge=1, le=8, description="Learned base: GRU layers.")
    epochs: int = Field(8, ge=1, le=1000, description="Learned base: training epochs.")
    batch_size: int = Field(128, ge=1, le=65536, description="Learned base: batch size.")
    learning_rate: float = Field(3e-3, gt=0, le=1, description="Learned base: AdamW learning rate.")
    seed: int = Field(0, ge=0, description="Learned base: initialisation and batching seed.")

    @model_validator(mode="after")
    def _model_only_for_causal_lm(self) -> BaseModelConfig:
        if self.kind == "causal_lm" and not self.model:
            raise ValueError("base.kind 'causal_lm' needs base.model: the name of a registered "
                             "model (`ksweep model add PATH --name NAME`, `ksweep model list`)")
        if self.kind != "causal_lm" and (self.model or self.model_sha256):
            raise ValueError(f"base.model is read by base.kind 'causal_lm' only (kind is "
                             f"{self.kind!r}); remove it or set kind: causal_lm")
        return self
