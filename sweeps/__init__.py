"""Sweeps: the spec schema, its expansion into a plan, and (elsewhere) the Ray Tune driver."""

from sweeps.plan.build import SweepPlan, build_plan, render_plan
from sweeps.spec import METRIC_NAMES, SweepSpec, load_sweep_spec, parse_sweep_spec

__all__ = [
    "METRIC_NAMES",
    "SweepPlan",
    "SweepSpec",
    "build_plan",
    "load_sweep_spec",
    "parse_sweep_spec",
    "render_plan",
]
