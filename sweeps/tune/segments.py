"""A sweep's segments: the trials each run of the Tuner trains, kept on disk.

A sweep runs as one or more segments, one Tune experiment each: segment 0 in
``<sweep>/tune`` (a sweep never extended has only it), segment k in ``<sweep>/tune-k``. A
segment's trials are fixed when it is made (``segments/k.json``: the plan's trials that no
earlier segment has, less the ones reused from other sweeps, with their MLflow runs), so a
driver killed mid-segment restores the same experiment; once the segment's Tuner has
returned, its trials' outcomes are kept beside it (``segments/k-outcomes.json``) and a later
driver reads them instead of fitting it again. The files are written whole or not at all.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sweeps.report.readout_table import TrialOutcome

__all__ = ["SEGMENTS_FOLDER", "Segment", "load_segments", "tune_folder", "write_outcomes",
           "write_segment"]

SEGMENTS_FOLDER = "segments"


def tune_folder(number: int) -> str:
    """The Tune experiment folder of segment ``number`` (under the sweep's folder)."""
    return "tune" if number == 0 else f"tune-{number}"


@dataclass
class Segment:
    """One run of the Tuner: the trials it trains and the ones it reuses instead.

    ``trials`` are plan trials (their params, ``shared_by`` and ``trial_hash``); ``reused``
    one entry per trial read from another sweep's run: ``trial`` (the plan trial it stands
    for), ``run_id``, ``sweep_id``, ``experiment_id``, ``trial_id`` (its id in that sweep);
    ``environment`` the training environment the driver hashed the trials under.
    """

    number: int
    trials: list[dict[str, Any]]
    reused: list[dict[str, Any]] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)
    outcomes: list[TrialOutcome] | None = None  # set once the segment's Tuner has returned

    @property
    def finished(self) -> bool:
        return self.outcomes is not None


def _write(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    staging.write_text(json.dumps(value, indent=1))
    os.replace(staging, path)


def write_segment(folder: Path, segment: Segment) -> None:
    """``segments/k.json`` (the trials are fixed from here on)."""
    _write(folder / SEGMENTS_FOLDER / f"{segment.number}.json",
           {"number": segment.number, "trials": segment.trials, "reused": segment.reused,
            "environment": segment.environment})


def write_outcomes(folder: Path, segment: Segment, outcomes: list[TrialOutcome]) -> None:
    """``segments/k-outcomes.json``: the segment's trials as its Tuner left them."""
    _write(folder / SEGMENTS_FOLDER / f"{segment.number}-outcomes.json",
           [asdict(outcome) for outcome in outcomes])
    segment.outcomes = outcomes


def load_segments(folder: Path) -> list[Segment]:
    """The sweep's segments in order, each with its outcomes when it has finished."""
    segments = []
    for path in sorted((folder / SEGMENTS_FOLDER).glob("[0-9]*.json"),
                       key=lambda p: int(p.stem.split("-")[0])):
        if "-" in path.stem:
            continue
        data = json.loads(path.read_text())
        segment = Segment(data["number"], data["trials"], data.get("reused", []),
                          data.get("environment", {}))
        done = path.with_name(f"{segment.number}-outcomes.json")
        if done.exists():
            segment.outcomes = [TrialOutcome(**item) for item in json.loads(done.read_text())]
        segments.append(segment)
    return segments
