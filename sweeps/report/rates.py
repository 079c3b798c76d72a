"""Rates: each cell's achieved rate against its target, the rate-distortion plane, what every
trial trained with, and whether the information its latent carries was priced.

- ``rates``: per rate-controlled configuration (a ``target_rate``, swept or the stacks' own kl
  option), the achieved test rate E[KL] and I(x; z) beside the target, their ratio, and a flag
  when the mean KL is more than :data:`RATE_TOLERANCE` (15%) off the target.
- ``rd_plane``: per configuration, the test rate (KL and I(x; z)) against the distortion, the
  unweighted NLL per target token (``recon_uniform``), the one unit every stack shares (Alemi et
  al. 2018 compare models on this plane, not at one beta).
- :func:`trained_options`: the options a trial trained with (the KL's, the prior, the latent
  estimator, the checkpoint selection), so a table of trials or cells says what was trained.
- :func:`credit_words`: where any cell trained with ``mutual_info_credit > 0``, the words every
  report prints beside its latent-use numbers: the information z carries was free there.

Pure functions of the spec, the trials' params and the report's cells.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from objectives.options import KLOptions
from sweeps.plan.build import SEARCH_AXES
from sweeps.report.readout_table import ALL_KINDS
from sweeps.spec import SweepSpec
from workers.contract import (
    KL,
    KL_MULTIPLIER,
    MUTUAL_INFO,
    RATE_TOLERANCE,
    SELECTION_METRIC,
    TRAIN,
    metric_name,
    off_target,
    selected_name,
)

__all__ = ["CREDIT", "DISTORTION", "RATE_READOUTS", "RATE_TOLERANCE", "SELECTED_MULTIPLIER",
           "TRAINED_OPTIONS",
           "annotate_credit", "credit_words", "rate_limitations", "rate_table",
           "rd_plane", "trained_options"]

DISTORTION = "recon_uniform"
"""The distortion of the rate-distortion plane: the unweighted NLL per target token, the same
unit for every stack (a weighted stack's own loss is on its own scale)."""
RATE_READOUTS: tuple[str, ...] = (KL, MUTUAL_INFO, DISTORTION)
"""The read-outs the rate tables need, which the report reads whatever analysis.metrics lists."""
SELECTED_MULTIPLIER = selected_name(metric_name(TRAIN, KL_MULTIPLIER))
"""The rate control's multiplier at the checkpoint val chose (logged per epoch as train/...)."""
CREDIT = "kl_mutual_info_credit"
# What a trial trained with: the columns of the trials table and the fields of every cell.
TRAINED_OPTIONS: tuple[str, ...] = (
    "kl_weight", "kl_scale", "kl_weight_units", "kl_free_bits", "kl_free_bits_mode", "kl_anneal",
    CREDIT, "kl_target_rate", "kl_rate_control_held_out", "prior", "latent_estimator", "selection")
_CONFIG = tuple(axis for axis in SEARCH_AXES if axis != "seed")  # a cell (as sweeps.report.build)
_KL_FIELDS = ("scale", "weight_units", "free_bits", "free_bits_mode", "anneal",
              "mutual_info_credit", "target_rate", "rate_control_held_out")


def trained_options(spec: SweepSpec, params: Mapping[str, Any]) -> dict[str, Any]:
    """The options of the trial with ``params`` (its swept values; the seed does not matter):
    the kl term's weight and options (None where the stack has no kl term), the prior, the
    latent estimator and the checkpoint selection rule. Empty when the spec cannot build the
    trial (a stack or model the spec does not hold)."""
    point = {key: params.get(key) for key in _CONFIG}
    point["seed"] = params.get("seed", spec.seed_list()[0])
    if any(point[key] is None for key in ("alpha", "loss_stack", "model")):
        return {}
    try:
        config = spec.trial_config_for({k: v for k, v in point.items() if v is not None})
    except (KeyError, ValueError):
        return {}
    kl = config.loss_stack.resolved_terms().get("kl")
    options = None if kl is None else KLOptions.model_validate(kl.options)
    out: dict[str, Any] = {"kl_weight": None if kl is None else float(kl.weight)}
    for name in _KL_FIELDS:
        out[f"kl_{name}"] = None if options is None else getattr(options, name)
    model = config.model
    out["prior"] = model.prior
    out["latent_estimator"] = (model.discrete_estimator if model.family == "discrete"
                               else "reparameterized (Gaussian)")
    out["selection"] = config.training.selection_metric or SELECTION_METRIC  # the metric it read
    return out


def _config(cell: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(cell.get(key) for key in _CONFIG)


def _summary(cell: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if cell is None:
        return None
    return {key: cell[key] for key in ("mean", "ci_low", "ci_high", "n", "seeds", "values")}


def _test_cells(cells: Sequence[Mapping[str, Any]], split: str) -> dict[tuple[Any, ...], dict[str, Any]]:
    """(config, metric) -> the all-kinds cell of ``split`` for the rate read-outs."""
    return {(_config(c), c["metric"]): dict(c) for c in cells
            if c["split"] == split and c["kind"] == ALL_KINDS and c["metric"] in RATE_READOUTS}


def _mean(values: Sequence[float] | None) -> float | None:
    known = [v for v in values or () if math.isfinite(v)]
    return sum(known) / len(known) if known else None



def rate_table(cells: Sequence[Mapping[str, Any]], split: str,
               multipliers: Mapping[tuple[Any, ...], Sequence[float]] | None = None
               ) -> list[dict[str, Any]]:
    """Per rate-controlled configuration: the target, the achieved ``split`` KL and I(x; z)
    (mean, interval, per seed), the ratio of mean KL to target, ``off_target``, how many
    seeds are off on their own, and ``kl_multiplier``: the mean over seeds of the multiplier
    at the selected checkpoint (``multipliers``: per configuration, one value per seed; None
    where no trial logged it)."""
    index = _test_cells(cells, split)
    out = []
    for config in sorted({key[0] for key in index}, key=str):
        entry = dict(zip(_CONFIG, config, strict=True))
        target = entry.get("target_rate")
        if target is None:
            continue
        kl, info = index.get((config, KL)), index.get((config, MUTUAL_INFO))
        mean = None if kl is None else kl["mean"]
        seeds_off = [] if kl is None else [off_target(v, target) for v in kl["values"]]
        out.append({**entry, "split": split, "rate": KL, "achieved_kl": _summary(kl),
                    "achieved_mutual_info": _summary(info),
                    "ratio": None if mean is None else mean / target,
                    "off_target": off_target(mean, target), "tolerance": RATE_TOLERANCE,
                    "seeds_off_target": sum(bool(v) for v in seeds_off),
                    "seeds": len(seeds_off), "kl_multiplier": _mean((multipliers or {}).get(config))})
    return out


def rd_plane(cells: Sequence[Mapping[str, Any]], split: str) -> list[dict[str, Any]]:
    """Per configuration with a ``split`` distortion: its rate (mean KL and I(x; z)) and its
    distortion (mean ``recon_uniform``), with intervals and n, sorted by stack then rate."""
    index = _test_cells(cells, split)
    out = []
    for config in {key[0] for key in index}:
        distortion = index.get((config, DISTORTION))
        if distortion is None:
            continue
        kl, info = index.get((config, KL)), index.get((config, MUTUAL_INFO))
        out.append({**dict(zip(_CONFIG, config, strict=True)), "split": split,
                    "rate_kl": None if kl is None else kl["mean"],
                    "rate_mutual_info": None if info is None else info["mean"],
                    "distortion": distortion["mean"], "distortion_metric": DISTORTION,
                    "kl": _summary(kl), "mutual_info": _summary(info),
                    "recon_uniform": _summary(distortion)})
    out.sort(key=lambda r: (r["loss_stack"], r["model"], -math.inf if r["rate_kl"] is None
                            else r["rate_kl"], str(_config(r))))
    return out


def annotate_credit(use: dict[str, Any], cells: Sequence[Mapping[str, Any]]) -> None:
    """Give each latent-use row its ``mutual_info_credit`` and ``information_priced`` (False
    where the credit was on: the information z carries cost nothing there)."""
    credit = {_config(c): c.get(CREDIT) for c in cells}
    for row in use.get("cells", []):
        gamma = credit.get(_config(row))
        row["mutual_info_credit"] = gamma
        row["information_priced"] = None if gamma is None else not gamma > 0


def credit_words(cells: Sequence[Mapping[str, Any]]) -> list[str]:
    """Words for every report where any cell trained with ``mutual_info_credit > 0`` (none
    otherwise): there the latent-use numbers measure information that was free."""
    credited = {_config(c): c[CREDIT] for c in cells if (c.get(CREDIT) or 0) > 0}
    if not credited:
        return []
    stacks = sorted({config[_CONFIG.index("loss_stack")] for config in credited})
    gammas = ", ".join(f"{g:g}" for g in sorted(set(credited.values())))
    return [f"UNPRICED INFORMATION: {len(credited)} configuration(s) ({', '.join(stacks)}) "
            f"trained with kl mutual_info_credit {gammas} > 0, which credits the batch's I(x; z) "
            "back: the information z carries was free there (at credit 1; at credit g it cost "
            "(1 - g) x beta per nat). Their KL, I(x; z), active units and AMI describe a latent "
            "whose information was unpriced, not a latent learned under the ELBO, and a contrast "
            "between such cells says nothing about a priced objective (mutual_info_credit: 0 "
            "keeps the ELBO)."]


def rate_limitations(rates: Sequence[Mapping[str, Any]]) -> list[str]:
    """Words on the rate-controlled cells that missed their target."""
    off = [r for r in rates if r["off_target"]]
    if not off:
        return []
    named = ", ".join(f"{r['loss_stack']}@alpha={r['alpha']:g} (target {r['target_rate']:g}, "
                      f"achieved {r['achieved_kl']['mean']:.3g})" for r in off[:6])
    more = f" and {len(off) - 6} more" if len(off) > 6 else ""
    return [f"OFF TARGET: {len(off)} of {len(rates)} rate-controlled cell(s) have a mean "
            f"achieved KL more than {RATE_TOLERANCE:.0%} off their target rate: {named}"
            f"{more}. Comparisons there are not at the declared rate."]
