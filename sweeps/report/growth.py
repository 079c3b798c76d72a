"""Honest statistics after growth: what the report of an extended sweep says, and how.

Adding seeds because an interval looked too wide is optional stopping: the interval and the
p-value of a contrast assume its n was fixed before anyone looked. So the report of a sweep
that grew (:mod:`sweeps.plan.growth`)

- records each extension: what it added, and after which report (``extensions``);
- keeps the primary family as first declared: a contrast at a value an extension added (an
  alpha, a stack or its baseline, a model, a swept beta or free bits) is exploratory unless
  that extension declared its contrasts primary before it ran (``added_by_extension``);
- marks every contrast whose n grew after it was first reported (seeds added by a later
  extension): ``extended: true``, and its claim says "extended: not a fixed-n interval".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["EXTENDED_WORDS", "axis_origins", "describe_extensions", "growth_limitations",
           "mark_growth", "primary_eligibility", "report_extensions"]

EXTENDED_WORDS = "extended: not a fixed-n interval"
_RECORD_KEYS = ("number", "added", "primary", "after_report", "state_before", "requested_at",
                "rows", "trials")
# A contrast's axis -> the extension record's key for its values.
_AXES = (("alpha", "alpha"), ("loss_stack", "loss_stacks"), ("baseline", "loss_stacks"),
         ("model", "models"), ("beta", "beta"), ("free_bits", "free_bits"))

Origins = dict[str, dict[Any, int]]


def _key(value: Any) -> Any:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


def axis_origins(extensions: Sequence[Mapping[str, Any]]) -> Origins:
    """Per record key (``alpha``, ``loss_stacks``, ``seeds``...): value -> the number of the
    extension that added it (values the sweep began with are absent: 0)."""
    origins: Origins = {}
    for record in extensions:
        for axis, values in record.get("added", {}).items():
            for value in values:
                origins.setdefault(axis, {}).setdefault(_key(value), int(record["number"]))
    return origins


def _contrast_origin(entry: Mapping[str, Any], origins: Origins) -> int:
    return max((origins.get(axis, {}).get(_key(entry.get(name)), 0) for name, axis in _AXES),
               default=0)


def primary_eligibility(extensions: Sequence[Mapping[str, Any]]
                        ) -> Callable[[Mapping[str, Any]], bool] | None:
    """Whether a contrast may stand in the primary family (None: any, for a sweep never
    extended): declared before it ran, by the first spec or by a primary extension."""
    if not extensions:
        return None
    origins = axis_origins(extensions)
    declared = {int(r["number"]) for r in extensions if r.get("primary")} | {0}
    return lambda entry: _contrast_origin(entry, origins) in declared


def mark_growth(contrasts: Sequence[dict[str, Any]], extensions: Sequence[Mapping[str, Any]]) -> None:
    """``added_by_extension`` and ``extended`` on every contrast, and the claim's words."""
    if not extensions:
        return
    origins = axis_origins(extensions)
    seeds = origins.get("seeds", {})
    for entry in contrasts:
        origin = _contrast_origin(entry, origins)
        entry["added_by_extension"] = origin or None
        entry["extended"] = any(seeds.get(_key(seed), 0) > origin for seed in entry.get("seeds", []))
        if origin and entry["family"] == "exploratory" and entry["claim"].startswith("exploratory"):
            entry["claim"] = (f"exploratory: added by extension {origin}, not declared primary "
                              "(no multiplicity adjustment)")
        if entry["extended"]:
            entry["claim"] = f"{entry['claim']}; {EXTENDED_WORDS}"


def report_extensions(extensions: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The extension records as the report keeps them (no request keys)."""
    return [{key: record.get(key) for key in _RECORD_KEYS} for record in extensions]


def describe_extensions(extensions: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per extension: what it added and after which report."""
    lines = []
    for record in extensions:
        added = "; ".join(f"{axis} {', '.join(_text(v) for v in values)}"
                          for axis, values in record.get("added", {}).items())
        after = record.get("after_report")
        when = (f"after report {after['number']} ({after.get('headline', '')})" if after
                else "before any report was written")
        primary = ", its contrasts declared primary" if record.get("primary") else ""
        lines.append(f"extension {record['number']}: added {added}, {when}{primary}")
    return lines


def _text(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def growth_limitations(contrasts: Sequence[Mapping[str, Any]],
                       extensions: Sequence[Mapping[str, Any]]) -> list[str]:
    """What the report of a grown sweep cannot claim, in words."""
    if not extensions:
        return []
    words = [f"The sweep was extended {len(extensions)} time(s): "
             + "; ".join(describe_extensions(extensions)) + "."]
    grown = [c for c in contrasts if c.get("extended")]
    if grown:
        words.append(f"{len(grown)} contrast(s) gained seeds after a report: marked "
                     f"'{EXTENDED_WORDS}'. Their intervals and p-values assume a fixed n; seeds "
                     "added after looking (optional stopping) make them optimistic.")
    added = [c for c in contrasts if c.get("added_by_extension") and c["family"] == "exploratory"]
    if added:
        words.append(f"{len(added)} contrast(s) at values an extension added are exploratory: "
                     "the primary family stays as first declared.")
    return words
