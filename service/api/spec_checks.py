"""POST /sweeps: refuse a ``base.kind: causal_lm`` the driver could not resolve (422, by field).

The same checks the driver runs when the sweep starts (:mod:`workers.lm.resolve`), moved to
submission so a wrong model name, pin or tokenizer never reaches the queue: the model must be
registered under ``KSWEEP_MODEL_ROOT``, a pinned ``model_sha256`` must match it, the spec must
name a dataset, and that dataset must have been tokenized by the model's tokenizer.
"""

from __future__ import annotations

from typing import Any

from service.api.deps import Services
from service.api.errors import ProblemError
from service.api.routes.datasets import store_of
from workers.lm.registry import ModelError, ModelStore, check_dataset_tokenizer


def _invalid(field: str, message: str) -> ProblemError:
    return ProblemError(422, "Invalid sweep spec", f"{field}: {message}", kind="invalid-spec")


def check_spec_model(spec: dict[str, Any], services: Services) -> None:
    """Raise a 422 ProblemError naming the field when the spec's causal_lm base cannot run.

    Call after ``check_spec_dataset`` (which refuses an unknown dataset first).
    """
    template = spec.get("template") or {}
    base = template.get("base") or {}
    if base.get("kind") != "causal_lm":
        return
    data = template.get("data") or {}
    if not (isinstance(data, dict) and data.get("dataset")):
        raise _invalid("template.base.kind", "'causal_lm' scores a dataset tokenized by the "
                       "model's tokenizer; the synthetic task's ids are not: set template.data.dataset")
    try:
        record = ModelStore(services.settings.resolved_model_root).get(str(base.get("model")))
    except ModelError as error:
        raise _invalid("template.base.model", str(error)) from None
    pin = base.get("model_sha256")
    if pin and pin != record.sha256:
        raise _invalid("template.base.model_sha256", f"pinned {pin} but model {record.name!r} "
                       f"holds {record.sha256}; pin the current hash or drop the pin")
    tokenizer = store_of(services).get(str(data["dataset"])).tokenizer
    try:
        check_dataset_tokenizer(str(data["dataset"]), tokenizer, record)
    except ModelError as error:
        raise _invalid("template.base.model", str(error)) from None
