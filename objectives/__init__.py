"""The shared objective library: token-weighted reconstruction losses for CVAEs.

Pure torch (no Ray, MLflow or FastAPI); the declarative specs (:mod:`objectives.spec`)
import without torch, and the names below load on first use (``lazy_loader``). See docs/concepts/objectives.md for the mathematics and
the conventions (log space, alpha = 0 continuity, zero, all-zero and empty rows).
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(__name__, submod_attrs={
    "diagnostics": ["KAPPA_SUMMARY_KEYS", "BaselineSelfCheck", "KappaSummaryAccumulator",
                    "baseline_self_check", "kappa_summary", "squared_coefficient_of_variation"],
    "reference_scale": ["ReferenceScale"],
    "options": ["BagOfWordsOptions", "KLOptions", "WeightingOptions"],
    "schedules": ["kl_anneal_factor"],
    "spec": ["PRESETS", "LossStackSpec", "TermSpec", "describe_presets", "describe_terms",
             "preset_spec"],
    "stack": ["LossOutput", "LossStack"],
    "terms": ["TERMS", "LossInputs", "TermDefinition"],
    "token_weighting": ["TokenWeightStats", "concentration_corrected_reconstruction",
                        "masked_example_mean", "normalized_concentration_corrected_reconstruction",
                        "normalized_concentration_corrected_token_weighted_reconstruction_loss",
                        "token_weight_stats", "token_weighted_reconstruction",
                        "uniform_reconstruction"],
})
