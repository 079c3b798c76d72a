"""Config of the synthetic strategy task (:class:`SyntheticTaskConfig`) and its vocabulary layout.

The single-kind task (``kind_proportions`` prefix 1, the default) has no private block and no
kind marker; any other proportions give the mixed task (see ``synthetic.py``).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from workers.contract import EXAMPLE_KINDS, REGISTERED_NAME_PATTERN, SHA256_HEX_PATTERN

PAD_ID = 0
BOS_ID = 1
CONTENT_START = 2

SplitName = Literal["train", "val", "test"]  # typing only: the values are contract.SPLITS
KINDS = EXAMPLE_KINDS  # the data side's name for them; an example's kind id is its index


class KindProportions(BaseModel):
    """Mixing weights of the example kinds (normalised to sum 1; need not sum to 1 as given)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prefix: float = Field(
        1.0, ge=0, description="Weight of `prefix` examples: s shows only in a short prefix "
        "(surprisal concentrated and strategy-explained; high kappa)."
    )
    diffuse: float = Field(
        0.0, ge=0, description="Weight of `diffuse` examples: no prefix, s shows weakly in every "
        "body token (body noise `diffuse_noise_rate`; low kappa)."
    )
    private: float = Field(
        0.0, ge=0, description="Weight of `private` examples: a short high-surprisal prefix that s "
        "does NOT explain (first token uniform over the private block of M tokens, the others over "
        "a tail block of m tokens: the shape of a strategy prefix), then a body that reveals s "
        "(`private_noise_rate`); kappa matched to `prefix` examples through `private_prefix_tokens`."
    )

    @model_validator(mode="after")
    def _check_positive(self) -> KindProportions:
        if self.prefix + self.diffuse + self.private <= 0:
            raise ValueError("kind_proportions: at least one of prefix, diffuse, private must be > 0")
        return self

    def probabilities(self) -> tuple[float, float, float]:
        """Normalised (prefix, diffuse, private)."""
        total = self.prefix + self.diffuse + self.private
        return (self.prefix / total, self.diffuse / total, self.private / total)


# The vocabulary's layout (ids are int64):
#
#     0                                  PAD
#     1                                  BOS
#     [2, 2 + V)                         content tokens (V = content_vocab)
#     [prefix_token_start + s*m, +m)     prefix block of strategy s (m = prefix_tokens_per_strategy)
#     [distractor_token_start, +D)       distractor tokens (D = num_distractor_tokens)
#     mixed task only:
#     [private_token_start, +M)          the private block: first token of a private prefix (M = private_prefix_tokens)
#     [private_tail_start, +m)           the private tail block: the other private prefix tokens
#     [kind_token_start, +3)             one context marker per example kind (prefix, diffuse, private)
#
# The single-kind task (``kind_proportions`` = prefix 1, diffuse 0, private 0, the default)
# has no private block and no kind marker; any other proportions give the *mixed* task.


class SyntheticTaskConfig(BaseModel):
    """Parameters of the synthetic strategy task.

    The config is frozen and rejects unknown fields, so it can be hashed,
    logged and used as a sweep key without silent typos.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    content_vocab: int = Field(
        16, ge=2, le=1_000_000, description="Number of content tokens V (context and body)."
    )
    num_strategies: int = Field(
        4, ge=2, le=100_000, description="Number of hidden strategies K, drawn uniformly."
    )
    context_length: int = Field(
        6, ge=1, le=100_000, description="Length of the context x (iid uniform content tokens); "
        "the mixed task appends one kind-marker token to it."
    )
    prefix_length: int = Field(
        2, ge=1, le=100_000, description="Length P of the prefix of `prefix` and `private` "
        "examples (`diffuse` examples have a body of P + L tokens instead)."
    )
    prefix_tokens_per_strategy: int = Field(
        4,
        ge=1,
        le=1_000_000,
        description="Size m of each strategy's private block of prefix tokens.",
    )
    body_length_min: int = Field(
        6, ge=1, le=100_000, description="Minimum body length L (inclusive)."
    )
    body_length_max: int = Field(
        10,
        ge=1,
        le=100_000,
        description="Maximum body length L (inclusive); must be >= body_length_min.",
    )
    noise_rate: float = Field(
        0.05,
        ge=0.0,
        lt=1.0,
        description="Probability that a non-distractor body token of a `prefix` example is "
        "uniform content instead of f_s(x, j).",
    )
    diffuse_noise_rate: float = Field(
        0.7,
        ge=0.0,
        lt=1.0,
        description="Mixed task: the same probability for the body of `diffuse` examples. High, "
        "so each body token reveals s only weakly.",
    )
    private_noise_rate: float | None = Field(
        None,
        ge=0.0,
        lt=1.0,
        description="Mixed task: the same probability for the body of `private` examples. None: "
        "`noise_rate`. The private body must stay low-surprisal for its kappa to be matchable to "
        "`prefix` examples (their bodies are nearly free given s), so with the default the first "
        "body tokens reveal s (about log K nats of strategy-explained surprisal at t = P).",
    )
    distractor_rate: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Probability that a body token is a uniform distractor token.",
    )
    num_distractor_tokens: int = Field(
        4, ge=1, le=1_000_000, description="Number D of distractor token ids."
    )
    kind_proportions: KindProportions = Field(
        default_factory=KindProportions,
        description="Mix of example kinds. The default (prefix only) is the legacy single-kind "
        "task; anything else is the mixed task (kind marker in x, private block in the vocab).",
    )
    private_prefix_tokens: int | None = Field(
        None,
        ge=1,
        le=100_000_000,
        description="Mixed task: size M of the private block (the first private prefix token "
        "costs log M nats under any model, with or without s; the others log m). None: chosen so "
        "that the median "
        "kappa at alpha 1 of `private` examples matches that of `prefix` examples "
        "(workers.data.calibration).",
    )
    train_size: int = Field(2048, ge=1, le=100_000_000, description="Number of training examples.")
    val_size: int = Field(512, ge=1, le=100_000_000, description="Number of validation examples.")
    test_size: int = Field(
        512, ge=1, le=100_000_000,
        description="Number of test examples (logged, read at the selected checkpoint; never "
        "used for selection).",
    )
    seed: int | None = Field(
        None, ge=0,
        description="Data seed; train, val and test use independent children of it. None (the "
        "default): the trial's seed, so each trial seed draws its own data sample; set it to pin "
        "the data across trial seeds. Generators called without a trial use 0.",
    )

    @model_validator(mode="after")
    def _check_body_lengths(self) -> SyntheticTaskConfig:
        if self.body_length_max < self.body_length_min:
            raise ValueError(
                f"body_length_max ({self.body_length_max}) must be >= "
                f"body_length_min ({self.body_length_min})"
            )
        return self

    @property
    def data_seed(self) -> int:
        """The seed the generator uses (``seed``, or 0 when unset)."""
        return 0 if self.seed is None else self.seed

    @property
    def mixed(self) -> bool:
        """True for the mixed task, False for the single-kind (prefix only) task."""
        return self.kind_proportions.probabilities() != (1.0, 0.0, 0.0)

    @property
    def prefix_token_start(self) -> int:
        """First id of strategy 0's prefix block."""
        return CONTENT_START + self.content_vocab

    @property
    def distractor_token_start(self) -> int:
        """First distractor token id."""
        return self.prefix_token_start + self.num_strategies * self.prefix_tokens_per_strategy

    @property
    def private_token_start(self) -> int:
        """First id of the private prefix block (mixed task)."""
        return self.distractor_token_start + self.num_distractor_tokens

    @property
    def resolved_private_prefix_tokens(self) -> int:
        """M: ``private_prefix_tokens``, or the kappa-matched value when unset (mixed task)."""
        if not self.mixed:
            return 0
        if self.private_prefix_tokens is not None:
            return self.private_prefix_tokens
        from workers.data.calibration import matched_private_prefix_tokens

        return matched_private_prefix_tokens(self)

    @property
    def private_tail_start(self) -> int:
        """First id of the private tail block (mixed task)."""
        return self.private_token_start + self.resolved_private_prefix_tokens

    @property
    def kind_token_start(self) -> int:
        """First kind-marker id (mixed task)."""
        return self.private_tail_start + (self.prefix_tokens_per_strategy if self.mixed else 0)

    @property
    def vocab_size(self) -> int:
        """Total vocabulary size including PAD and BOS."""
        if not self.mixed:
            return self.private_token_start
        return self.kind_token_start + len(KINDS)

    @property
    def max_target_length(self) -> int:
        """Padded target length T = prefix_length + body_length_max."""
        return self.prefix_length + self.body_length_max

    @property
    def input_context_length(self) -> int:
        """Width of the context the models see (the mixed task appends the kind marker)."""
        return self.context_length + (1 if self.mixed else 0)

    def log_k(self) -> float:
        """log K, the most information about s a latent can need (nats)."""
        return math.log(self.num_strategies)


# --- a registered dataset as the data source (docs/guide/datasets-training.md) -------------

DATASET_NAME_PATTERN = f"^{REGISTERED_NAME_PATTERN}$"
SHA256_PATTERN = f"^{SHA256_HEX_PATTERN}$"


class SplitFractions(BaseModel):
    """Fractions of a seeded split (used only when the table has no ``split`` column)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    train: float = Field(0.8, ge=0, le=1, description="Share of rows in train.")
    val: float = Field(0.1, ge=0, le=1, description="Share of rows in val.")
    test: float = Field(0.1, ge=0, le=1, description="Share of rows in test.")

    @model_validator(mode="after")
    def _check_sum(self) -> SplitFractions:
        if abs(self.train + self.val + self.test - 1.0) > 1e-6:
            raise ValueError(
                f"split_fractions must sum to 1 (train {self.train:g} + val {self.val:g} + "
                f"test {self.test:g} = {self.train + self.val + self.test:g}); fix the three values")
        return self


class DatasetDataConfig(BaseModel):
    """A registered dataset as the trial's data (``template.data: {dataset: NAME, ...}``).

    A spec names the dataset and may pin its sha256; the caller (``ksweep train``,
    ``ksweep sweep run``, the service driver) resolves the name to its hash once and fills
    ``sha256`` and ``root`` (the store's folder) before any trial starts, so every trial of
    a sweep reads the same content even if the name is replaced meanwhile.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset: str = Field(
        ..., pattern=DATASET_NAME_PATTERN,
        description="Name of a registered dataset (`ksweep data list`).",
    )
    sha256: str | None = Field(
        None, pattern=SHA256_PATTERN,
        description="Pin: the content hash the name must resolve to (refused when it differs). "
        "Unset: whatever the name holds when the sweep starts (then recorded here).",
    )
    root: str | None = Field(
        None, max_length=4096,
        description="The dataset store's folder, filled in by the caller (KSWEEP_DATA_ROOT or "
        "the service's settings); a spec leaves it unset.",
    )
    split_fractions: SplitFractions = Field(
        default_factory=SplitFractions,
        description="Seeded split by fractions, used only when the table has no `split` column.",
    )
    split_seed: int = Field(0, ge=0, le=2**32 - 1, description="Seed of the split by fractions.")
    max_target_length: int | None = Field(
        None, ge=1, le=1_000_000,
        description="Longest target y a trial accepts. Unset: the longest in the dataset. A "
        "longer y is refused (`truncation: refuse`) or cut to its first max_target_length "
        "tokens (`truncation: head`, counted and logged as data.truncated_rows).",
    )
    truncation: Literal["refuse", "head"] = Field(
        "refuse",
        description="What a y longer than max_target_length does: 'refuse' (an error naming "
        "the first such row) or 'head' (keep its first tokens; base_nll is cut alike).",
    )

    @property
    def seed(self) -> int:
        """The split seed (the synthetic task's ``seed`` counterpart, logged as data.resolved_seed)."""
        return self.split_seed

    @property
    def resolved(self) -> bool:
        """True once the caller filled in ``sha256`` and ``root``."""
        return self.sha256 is not None and self.root is not None


def is_dataset(data: object) -> bool:
    """True when a trial's data is a registered dataset (not the synthetic task)."""
    return isinstance(data, DatasetDataConfig)
