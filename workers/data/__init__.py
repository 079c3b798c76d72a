"""Synthetic strategy task: data generator and exact z-free oracle base model.

Names load on first use (``lazy_loader``), so ``workers.data.config`` imports without torch.
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(__name__, submod_attrs={
    "config": ["BOS_ID", "CONTENT_START", "KINDS", "KindProportions", "PAD_ID",
               "SyntheticTaskConfig"],
    "oracle": ["oracle_base_nll", "oracle_conditional_nll", "oracle_predictive",
               "oracle_strategy_posterior", "oracle_token_log_likelihood"],
    "synthetic": ["SyntheticSplit", "generate_split", "generate_splits", "generate_task",
                  "kind_layout", "strategy_body_token", "strategy_constants"],
})
