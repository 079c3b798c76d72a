"""Synthetic strategy task: data generator and exact z-free oracle base model."""

from workers.data.oracle import (
    oracle_base_nll,
    oracle_predictive,
    oracle_strategy_posterior,
    oracle_token_log_likelihood,
)
from workers.data.synthetic import (
    BOS_ID,
    CONTENT_START,
    PAD_ID,
    SyntheticSplit,
    SyntheticTaskConfig,
    generate_split,
    generate_task,
    strategy_body_token,
    strategy_constants,
)

__all__ = [
    "BOS_ID",
    "CONTENT_START",
    "PAD_ID",
    "SyntheticSplit",
    "SyntheticTaskConfig",
    "generate_split",
    "generate_task",
    "oracle_base_nll",
    "oracle_predictive",
    "oracle_strategy_posterior",
    "oracle_token_log_likelihood",
    "strategy_body_token",
    "strategy_constants",
]
