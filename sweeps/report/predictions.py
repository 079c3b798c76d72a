"""Predictions as declared at submission, and any change after the first segment ran.

A prediction (``analysis.contrasts[].predicted``) is worth something only if it was written
before the data: the sweep records its declared predictions once, with the submission time,
in its folder (``predictions.json``) when its first segment starts, and never rewrites the
file. Every report reads them back: a contrast is judged against its prediction as first
declared, and one whose prediction differs in the spec the report was built from (a resumed or
grown sweep whose spec was edited) is marked ``prediction_changed`` with both signs in words.
report.md prints them (:func:`sweeps.report.text.prediction_lines`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sweeps.report.contrasts import claim_words
from sweeps.spec import SweepSpec

__all__ = ["PREDICTIONS_FILE", "declared_predictions", "mark_changed_predictions",
           "prediction_section", "record_predictions"]

PREDICTIONS_FILE = "predictions.json"


def declared_predictions(spec: SweepSpec) -> list[dict[str, Any]]:
    """The spec's declared contrasts with their predictions (None where none is declared)."""
    return [{"stack": c.stack, "baseline": c.baseline, "primary": c.primary,
             "predicted": c.predicted} for c in spec.analysis.contrasts or ()]


def record_predictions(folder: Path, spec: SweepSpec, submitted_at: datetime | None = None
                       ) -> dict[str, Any]:
    """The sweep's predictions as first recorded in ``folder``; recorded now (with
    ``submitted_at``, else the current time) when the folder holds none yet."""
    path = Path(folder) / PREDICTIONS_FILE
    if path.is_file():
        record: dict[str, Any] = json.loads(path.read_text())
        return record
    when = submitted_at or datetime.now(UTC)
    if when.tzinfo is None:  # the store's timestamps are UTC without a zone (sqlite)
        when = when.replace(tzinfo=UTC)
    stamp = when.astimezone(UTC).isoformat(timespec="seconds")
    record = {"submitted_at": stamp, "contrasts": declared_predictions(spec)}
    path.write_text(json.dumps(record, indent=1))
    return record


def prediction_section(spec: SweepSpec, record: Mapping[str, Any] | None) -> dict[str, Any]:
    """report.json's ``predictions``: each declared contrast's prediction as first declared,
    its value now, and whether it changed."""
    first = {(c["stack"], c["baseline"]): c for c in (record or {}).get("contrasts", ())}
    entries = []
    for now in declared_predictions(spec):
        was = first.get((now["stack"], now["baseline"]))
        entries.append({**now, "predicted": was["predicted"] if was else now["predicted"],
                        "predicted_now": now["predicted"],
                        "changed": was is not None and was["predicted"] != now["predicted"],
                        "declared_later": record is not None and was is None})
    return {"submitted_at": (record or {}).get("submitted_at"), "contrasts": entries}


def mark_changed_predictions(contrasts: Sequence[dict[str, Any]], section: Mapping[str, Any],
                             metric: str) -> list[str]:
    """Judge each stack contrast on ``metric`` on its prediction as first declared; mark those
    whose prediction changed. Returns the words for "What this report cannot claim"."""
    changed = {(c["stack"], c["baseline"]): c for c in section["contrasts"] if c["changed"]}
    for entry in contrasts:
        if entry.get("contrast") != "stack" or entry.get("metric") != metric:
            continue
        was = changed.get((entry["loss_stack"], entry["baseline"]))
        if was is None:
            continue
        entry.update(predicted=was["predicted"], predicted_now=was["predicted_now"],
                     prediction_changed=True)
        entry["claim"] = (f"{claim_words(entry)}; prediction changed after the first segment ran "
                          f"(first {was['predicted'] or 'none'}, now {was['predicted_now'] or 'none'}"
                          "): judged on the first")
    if not changed:
        return []
    pairs = ", ".join(f"{stack} - {baseline}" for stack, baseline in changed)
    return [f"The prediction of {pairs} changed after the first segment ran (the spec was edited "
            "on a resume): each is judged on its prediction as first declared."]
