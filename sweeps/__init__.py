"""Sweeps: the spec (``spec/``), its plan (``plan/``), the Ray Tune driver (``tune/``), the
report (``report/``) and the progress record they share (``status.py``).

Names load on first use (``lazy_loader``), so importing one subpackage (the API imports
``sweeps.spec`` and ``sweeps.status``) does not import the others.
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(__name__, submod_attrs={
    "plan.build": ["SweepPlan", "build_plan", "render_plan"],
    "spec": ["METRIC_NAMES", "SweepSpec", "load_sweep_spec", "parse_sweep_spec"],
})
