"""Synthetic strategy task: data generator and exact z-free oracle base model."""

from workers.data.config import KINDS, KindProportions, SyntheticTaskConfig
from workers.data.oracle import (
    oracle_base_nll,
    oracle_conditional_nll,
    oracle_predictive,
    oracle_strategy_posterior,
    oracle_token_log_likelihood,
)
from workers.data.synthetic import (
    BOS_ID,
    CONTENT_START,
    PAD_ID,
    SPLITS,
    SyntheticSplit,
    generate_split,
    generate_splits,
    generate_task,
    kind_layout,
    strategy_body_token,
    strategy_constants,
)

__all__ = [
    "BOS_ID",
    "CONTENT_START",
    "KINDS",
    "KindProportions",
    "PAD_ID",
    "SPLITS",
    "SyntheticSplit",
    "SyntheticTaskConfig",
    "generate_split",
    "generate_splits",
    "generate_task",
    "kind_layout",
    "oracle_conditional_nll",
    "oracle_base_nll",
    "oracle_predictive",
    "oracle_strategy_posterior",
    "oracle_token_log_likelihood",
    "strategy_body_token",
    "strategy_constants",
]
