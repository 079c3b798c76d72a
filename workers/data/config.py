"""The synthetic task's configuration and vocabulary layout (pure pydantic, no torch).

See :mod:`workers.data.synthetic` for the generator and the meaning of every id range.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

PAD_ID = 0
BOS_ID = 1
CONTENT_START = 2

SplitName = Literal["train", "val"]


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
        6, ge=1, le=100_000, description="Length of the context x (iid uniform content tokens)."
    )
    prefix_length: int = Field(
        2, ge=1, le=100_000, description="Length P of the strategy-revealing prefix of y."
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
        description="Probability that a non-distractor body token is uniform content "
        "instead of f_s(x, j).",
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
    train_size: int = Field(2048, ge=1, le=100_000_000, description="Number of training examples.")
    val_size: int = Field(512, ge=1, le=100_000_000, description="Number of validation examples.")
    seed: int = Field(0, ge=0, description="Root seed; train and val use independent children.")

    @model_validator(mode="after")
    def _check_body_lengths(self) -> SyntheticTaskConfig:
        if self.body_length_max < self.body_length_min:
            raise ValueError(
                f"body_length_max ({self.body_length_max}) must be >= "
                f"body_length_min ({self.body_length_min})"
            )
        return self

    @property
    def prefix_token_start(self) -> int:
        """First id of strategy 0's prefix block."""
        return CONTENT_START + self.content_vocab

    @property
    def distractor_token_start(self) -> int:
        """First distractor token id."""
        return self.prefix_token_start + self.num_strategies * self.prefix_tokens_per_strategy

    @property
    def vocab_size(self) -> int:
        """Total vocabulary size including PAD and BOS."""
        return self.distractor_token_start + self.num_distractor_tokens

    @property
    def max_target_length(self) -> int:
        """Padded target length T = prefix_length + body_length_max."""
        return self.prefix_length + self.body_length_max
