"""The shared objective library: token-weighted reconstruction losses for CVAEs.

Pure torch (no Ray, MLflow or FastAPI). See OBJECTIVE.md for the mathematics and
the conventions (log space, alpha = 0 continuity, zero, all-zero and empty rows).
"""

from objectives.diagnostics import (
    KAPPA_SUMMARY_KEYS,
    BaselineSelfCheck,
    KappaSummaryAccumulator,
    baseline_self_check,
    kappa_summary,
    squared_coefficient_of_variation,
)
from objectives.reference_scale import ReferenceScale
from objectives.stack import (
    PRESETS,
    LossOutput,
    LossStack,
    LossStackSpec,
    TermSpec,
    describe_presets,
    preset_spec,
)
from objectives.terms import (
    TERMS,
    BagOfWordsOptions,
    KLOptions,
    LossInputs,
    TermDefinition,
    WeightingOptions,
    kl_anneal_factor,
)
from objectives.token_weighting import (
    TokenWeightStats,
    concentration_corrected_reconstruction,
    masked_example_mean,
    normalized_concentration_corrected_reconstruction,
    normalized_concentration_corrected_token_weighted_reconstruction_loss,
    token_weight_stats,
    token_weighted_reconstruction,
    uniform_reconstruction,
)


def describe_terms() -> list[dict]:
    """Every registered term as a JSON-serialisable dict (for ``GET /objectives``)."""
    return [definition.describe() for definition in TERMS.values()]


__all__ = [
    "KAPPA_SUMMARY_KEYS",
    "PRESETS",
    "TERMS",
    "BagOfWordsOptions",
    "BaselineSelfCheck",
    "KLOptions",
    "KappaSummaryAccumulator",
    "LossInputs",
    "LossOutput",
    "LossStack",
    "LossStackSpec",
    "ReferenceScale",
    "TermDefinition",
    "TermSpec",
    "TokenWeightStats",
    "WeightingOptions",
    "baseline_self_check",
    "concentration_corrected_reconstruction",
    "describe_presets",
    "describe_terms",
    "kappa_summary",
    "kl_anneal_factor",
    "masked_example_mean",
    "normalized_concentration_corrected_reconstruction",
    "normalized_concentration_corrected_token_weighted_reconstruction_loss",
    "preset_spec",
    "squared_coefficient_of_variation",
    "token_weight_stats",
    "token_weighted_reconstruction",
    "uniform_reconstruction",
]
