"""POST /sweeps: refuse a spec whose dataset or ``causal_lm`` base the driver could not use.

The checks the driver makes when the sweep starts, made at submission so a wrong name, pin or
tokenizer never reaches the queue: the dataset must be registered and the owner's (a pinned
``sha256`` matching it); a causal_lm base's model must be registered under
``KSWEEP_MODEL_ROOT`` (a pinned ``model_sha256`` matching it) and must have tokenized that dataset.
"""

from __future__ import annotations

from typing import Any

from service.api.deps import Services, may_act_on
from service.api.errors import ProblemError
from workers.datasets.limits import DatasetError
from workers.datasets.store import DatasetNotFound


def _invalid(field: str, message: str) -> ProblemError:
    return ProblemError(422, "Invalid sweep spec", f"{field}: {message}", kind="invalid-spec")


def spec_dataset(spec: dict[str, Any]) -> str | None:
    """The dataset a stored spec names (``template.data.dataset``), or None (synthetic task)."""
    data = (spec.get("template") or {}).get("data") or {}
    name = data.get("dataset") if isinstance(data, dict) else None
    return name if isinstance(name, str) else None


def check_spec_dataset(spec: dict[str, Any], owner: str, services: Services) -> None:
    """Refuse a sweep spec naming a dataset that is not registered (422) or not the owner's (403).

    A pinned ``sha256`` must match the registered content (422). Called by POST /sweeps.
    """
    name = spec_dataset(spec)
    if name is None:
        return
    try:
        record = services.datasets.get(name)
    except (DatasetNotFound, DatasetError):
        raise ProblemError(422, "Invalid sweep spec", f"template.data.dataset: no dataset named "
                           f"{name!r}; register it with `ksweep data add FILE --name {name}`",
                           kind="invalid-spec") from None
    if not may_act_on(owner, record.owner):
        raise ProblemError(403, "Forbidden", f"dataset {name!r} belongs to {record.owner!r}; "
                           "register your own copy", kind="dataset-forbidden")
    pin = (spec.get("template") or {}).get("data", {}).get("sha256")
    if pin and pin != record.sha256:
        raise ProblemError(422, "Invalid sweep spec", f"template.data.sha256: dataset {name!r} "
                           f"holds {record.sha256}, not {pin}; pin the current hash or drop the pin",
                           kind="invalid-spec")


def check_spec_model(spec: dict[str, Any], services: Services) -> None:
    """Raise a 422 ProblemError naming the field when the spec's causal_lm base cannot run.

    Call after ``check_spec_dataset`` (which refuses an unknown dataset first).
    """
    # The model registry loads with the first causal_lm spec, not with the app.
    from workers.lm.registry import ModelError, check_dataset_tokenizer

    template = spec.get("template") or {}
    base = template.get("base") or {}
    if base.get("kind") != "causal_lm":
        return
    data = template.get("data") or {}
    if not (isinstance(data, dict) and data.get("dataset")):
        raise _invalid("template.base.kind", "'causal_lm' scores a dataset tokenized by the "
                       "model's tokenizer; the synthetic task's ids are not: set template.data.dataset")
    try:
        record = services.models.get(str(base.get("model")))
    except ModelError as error:
        raise _invalid("template.base.model", str(error)) from None
    pin = base.get("model_sha256")
    if pin and pin != record.sha256:
        raise _invalid("template.base.model_sha256", f"pinned {pin} but model {record.name!r} "
                       f"holds {record.sha256}; pin the current hash or drop the pin")
    tokenizer = services.datasets.get(str(data["dataset"])).tokenizer
    try:
        check_dataset_tokenizer(str(data["dataset"]), tokenizer, record)
    except ModelError as error:
        raise _invalid("template.base.model", str(error)) from None
