"""The sweep spec: its axes and sections, cross-field checks, and loading from text or files."""

from sweeps.spec.loading import load_sweep_spec, parse_sweep_spec
from sweeps.spec.sections import (
    METRIC_NAMES,
    READOUT_METRICS,
    AlphaRange,
    AnalysisSpec,
    BetaRange,
    BudgetSpec,
    ContrastSpec,
    FreeBitsRange,
    ObjectiveSpec,
    ResourcesSpec,
    SchedulerSpec,
    SearchSpec,
    TargetRateRange,
    TrackingSpec,
    ValueRange,
)
from sweeps.spec.sweep import SweepSpec

__all__ = [
    "METRIC_NAMES",
    "READOUT_METRICS",
    "AlphaRange",
    "AnalysisSpec",
    "BetaRange",
    "BudgetSpec",
    "ContrastSpec",
    "FreeBitsRange",
    "ObjectiveSpec",
    "ResourcesSpec",
    "SchedulerSpec",
    "SearchSpec",
    "SweepSpec",
    "TargetRateRange",
    "TrackingSpec",
    "ValueRange",
    "load_sweep_spec",
    "parse_sweep_spec",
]
