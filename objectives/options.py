"""The options each loss term takes: pydantic models that refuse unknown fields.

A term's declaration (:data:`objectives.spec.TERM_INFO`) names its options model; a loss
stack's ``terms.NAME.options`` are validated against it. Torch-free.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["DEFAULT_CYCLE_STEPS", "DEFAULT_WARMUP_STEPS", "BagOfWordsOptions", "KLOptions",
           "NoOptions", "WeightingOptions"]

# The KL anneal's lengths in optimizer steps when neither steps nor a share of the run are given.
DEFAULT_WARMUP_STEPS = 1000
DEFAULT_CYCLE_STEPS = 1000


class NoOptions(BaseModel):
    """This term takes no options."""

    model_config = ConfigDict(extra="forbid")


class WeightingOptions(BaseModel):
    """Options of the token-weighted reconstruction terms."""

    model_config = ConfigDict(extra="forbid")
    alpha: float | None = Field(
        None,
        ge=0,
        allow_inf_nan=False,
        description="Override the stack's alpha for this term only (e.g. a raw term at alpha = 1 "
        "beside a corrected one at alpha = 2). Unset: the stack's alpha.",
    )


class KLOptions(BaseModel):
    """Options of the KL term. Its weight is beta."""

    model_config = ConfigDict(extra="forbid")
    weight_units: Literal["beta", "effective"] = Field(
        "beta",
        description="What the term's weight is. 'beta': the KL weight itself. 'effective': effective "
        "beta; the stack trains at beta = weight x S, S its reconstruction's weight on the raw nats "
        "scale (1 for uniform, R_tok, R~; 1 / c_base for R^ and normalized uniform, measured by the "
        "trial), so every stack of a sweep sits at one matched effective beta without a second "
        "beta value (docs/concepts/objectives.md, effective beta).",
    )
    scale: Literal["example", "token"] = Field(
        "example",
        description="The unit of the KL beside a per-token-mean reconstruction. 'example': each "
        "example's KL in nats, as it is, so beta weighs it like beta x (the example's target "
        "length) in ELBO units. 'token': each example's KL divided by its own number n of "
        "active target tokens, so with `uniform` the loss is the mean over examples of "
        "(sum_t l_t + beta KL) / n and beta is the ELBO's own weight, the same on 10- and "
        "40-token data. Free bits stay in nats of KL per example under both "
        "(docs/concepts/objectives.md, KL units).",
    )
    free_bits: float = Field(
        0.0,
        ge=0,
        allow_inf_nan=False,
        description="Free bits lambda in nats: KL below lambda is not penalised (0 = off).",
    )
    free_bits_mode: Literal["example", "dimension"] = Field(
        "example",
        description="'example': mean_b max(lambda, sum_d KL_bd). 'dimension' (Kingma et al. 2016): "
        "sum_d max(lambda, mean_b KL_bd), which needs kl of shape [B, D].",
    )
    anneal: Literal["none", "linear", "cyclical"] = Field(
        "none",
        description="Schedule of the factor multiplying beta: 'linear' ramps from `anneal_start` to 1 "
        "over `warmup_steps` (or `warmup_fraction` of the run); 'cyclical' (Fu et al. 2019) "
        "repeats, every `cycle_steps` (or over `cycles` equal cycles of the run), a ramp over "
        "the first `cycle_ratio` of the cycle and then holds 1.",
    )
    anneal_start: float = Field(
        0.0, ge=0, le=1, allow_inf_nan=False, description="The factor at step 0 of a ramp."
    )
    warmup_steps: int | None = Field(
        None, ge=1,
        description=f"Length of the linear ramp in optimizer steps. Unset: {DEFAULT_WARMUP_STEPS}, "
        "or `warmup_fraction` of the run when that is set (not both).",
    )
    warmup_fraction: float | None = Field(
        None, gt=0, le=1, allow_inf_nan=False,
        description="Length of the linear ramp as a fraction of the trial's total optimizer "
        "steps (epochs x ceil(train rows / batch_size)), rounded to the nearest step (at least "
        "1). Instead of `warmup_steps`.",
    )
    cycle_steps: int | None = Field(
        None, ge=1,
        description=f"Length of one cyclical period in optimizer steps. Unset: "
        f"{DEFAULT_CYCLE_STEPS}, or the run divided by `cycles` when that is set (not both).",
    )
    cycles: int | None = Field(
        None, ge=1, le=100_000,
        description="Number of cyclical periods in the trial's run (Fu et al.'s M): each lasts "
        "total optimizer steps / cycles (not rounded, so the last cycle ends with the run). "
        "Instead of `cycle_steps`.",
    )
    cycle_ratio: float = Field(
        0.5, gt=0, le=1, allow_inf_nan=False, description="Fraction of a cycle spent ramping up."
    )
    mutual_info_credit: float = Field(
        0.0, ge=0, le=1, allow_inf_nan=False,
        description="gamma: the term penalises mean_x KL(q(z|x) || p) - gamma * I(x; z), I estimated "
        "on the batch as H(mean q) - mean H(q) (discrete latent only). 0: the per-example KL. 1 with "
        "`model.prior: standard`: the KL of the batch's aggregate posterior from the prior (batch "
        "prior regularisation, Zhao et al. 2018), which keeps every category in use and leaves the "
        "information z carries unpenalised; between, information costs (1 - gamma) beta per nat.",
    )
    target_rate: float | None = Field(
        None, gt=0, allow_inf_nan=False,
        description="Train to this rate R* in nats per example: the batch mean, over examples with "
        "an active token, of KL(q(z|x,y) || p(z|x)) (the quantity logged as `{split}/kl`). The KL "
        "weight becomes a multiplier beta_t = exp(log beta_t), updated after every optimizer "
        "step by log beta += rate_control_lr x (rate - R*) / R*: too much information raises its "
        "price, too little lowers it, never to 0 (the objective stays a beta-ELBO at every step). "
        "It starts at the term's weight and is logged as `train/kl_multiplier` "
        "(objectives/rate_control.py; docs/concepts/rates.md). Refused with "
        "`mutual_info_credit` > 0, an `anneal` schedule, or `free_bits` >= R*. Unset: off.",
    )
    rate_control_lr: float = Field(
        0.01, gt=0, le=1, allow_inf_nan=False,
        description="The target-rate controller's step size: the change of log beta per optimizer "
        "step when the batch's rate is twice the target (or, with the sign reversed, 0).",
    )
    rate_control_held_out: bool = Field(
        True,
        description="Hold the declared rate on held-out data: at every epoch's end the train rate "
        "the multiplier steers to moves halfway to R* x (the epoch's train rate / its val rate), "
        "within [R*/4, 4 R*], so an encoder that spends more nats on unseen rows than on the rows "
        "it trained on still reaches R* on val and test. false: the train batches' rate is held "
        "at R* and the held-out rate may drift from it.",
    )
    rate_control_min_beta: float = Field(
        1e-6, gt=0, allow_inf_nan=False,
        description="The smallest beta the target-rate controller may set (a rate the model cannot "
        "reach leaves beta here, still priced, rather than drifting without end).",
    )
    rate_control_max_beta: float = Field(
        1e4, gt=0, allow_inf_nan=False,
        description="The largest beta the target-rate controller may set.",
    )

    @model_validator(mode="after")
    def _steps_or_fraction(self) -> KLOptions:
        for steps, relative in (("warmup_steps", "warmup_fraction"), ("cycle_steps", "cycles")):
            if getattr(self, steps) is not None and getattr(self, relative) is not None:
                raise ValueError(
                    f"set {steps} (absolute optimizer steps) or {relative} (relative to the "
                    f"trial's run), not both; remove one of them")
        return self

    @model_validator(mode="after")
    def _target_rate_alone(self) -> KLOptions:
        target = self.target_rate
        if target is None:
            return self
        if self.mutual_info_credit > 0:
            raise ValueError(
                f"target_rate ({target:g}) prices information that mutual_info_credit "
                f"({self.mutual_info_credit:g}) credits back: the controlled rate would not be what "
                "the objective prices; set mutual_info_credit to 0 (or remove target_rate)")
        if self.anneal != "none":
            raise ValueError(
                f"target_rate sets the KL weight at every step, which anneal '{self.anneal}' also "
                "schedules; set anneal: none (the controller starts at the term's weight)")
        if self.free_bits >= target:
            raise ValueError(
                f"free_bits ({self.free_bits:g}) must be below target_rate ({target:g}): at the "
                "target every example's KL would sit under the floor, where beta has no gradient "
                "to act through; lower free_bits (or 0)")
        if self.rate_control_min_beta >= self.rate_control_max_beta:
            raise ValueError(
                f"rate_control_min_beta ({self.rate_control_min_beta:g}) must be below "
                f"rate_control_max_beta ({self.rate_control_max_beta:g}); widen the bounds")
        return self

    @property
    def relative(self) -> bool:
        """Whether a schedule length is given relative to the run (needs its total steps)."""
        return self.warmup_fraction is not None or self.cycles is not None


class BagOfWordsOptions(BaseModel):
    """Options of the kgCVAE bag-of-words auxiliary loss."""

    model_config = ConfigDict(extra="forbid")
    reduction: Literal["mean", "sum"] = Field(
        "mean",
        description="Per example, 'mean' averages -log p_bow(y_t) over active tokens (the scale of "
        "the uniform reconstruction); 'sum' adds them up as Zhao et al. (2017) do.",
    )
