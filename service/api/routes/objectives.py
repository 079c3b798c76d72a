"""``/api/v1/objectives``: the loss terms, their options and the presets of the objective library."""

from __future__ import annotations

from fastapi import APIRouter

from objectives.spec import describe_presets, describe_terms
from service.api.deps import ReaderDep
from service.api.schemas import Objectives, PresetInfo, TermInfo
from workers.contract import METRIC_NAMES

router = APIRouter(tags=["objectives"])


@router.get("/objectives", response_model=Objectives,
            summary="Loss terms (with the JSON schema of their options), presets, metric names")
def get_objectives(_reader: ReaderDep) -> Objectives:
    return Objectives(terms=[TermInfo(**term) for term in describe_terms()],
                      presets=[PresetInfo(**preset) for preset in describe_presets()],
                      metrics=list(METRIC_NAMES))
