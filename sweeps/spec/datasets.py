"""A sweep on a registered dataset: resolve its name once, and refuse what it cannot give.

:func:`resolve_spec_data` runs once per sweep, in the driver, before any trial: the dataset's
name becomes its sha256 (a pin is checked; a resumed sweep keeps the hash it started with) and
the store root the caller passed, so every trial reads the same content. A dataset's default
metrics are AMI; without a ``label`` column they are ``elbo``, and a spec naming a metric the
dataset cannot give, ``base.kind: oracle`` or a caveat analysis is refused by name.
"""

from __future__ import annotations

import json
from pathlib import Path

from sweeps.spec import READOUT_METRICS, SweepSpec
from sweeps.spec.sections import DEFAULT_OBJECTIVE_METRIC
from workers.contract import (
    CHANCE_READOUTS,
    ELBO,
    EPOCHS_TO_NMI,
    EPOCHS_TO_NMI_CENSORED,
    LATENT_AMI,
    NMI_AUC,
    TEST_ELBO,
    VAL_LATENT_AMI,
    VAL_LATENT_ARI,
    VAL_LATENT_NMI,
)
from workers.data.config import DatasetDataConfig
from workers.datasets.resolve import DatasetResolutionError, dataset_columns, resolve_dataset
from workers.datasets.store import DatasetStore
from workers.datasets.table import BASE_NLL, LABEL
from workers.zfree.resolve import resolve_model

NO_LABEL = "has no label column, so there is no latent to recover"

# The read-outs and metrics a dataset without a label cannot give (no latent to recover).
LABEL_READOUTS = frozenset({"latent_nmi", "latent_ari", "mi_zs", NMI_AUC, EPOCHS_TO_NMI,
                            EPOCHS_TO_NMI_CENSORED, *CHANCE_READOUTS})
LABEL_METRICS = frozenset({VAL_LATENT_NMI, VAL_LATENT_ARI, VAL_LATENT_AMI})
# The label metrics a label-less dataset replaces rather than refuses: the synthetic task's
# defaults and a dataset's (SweepSpec._dataset_defaults).
_DEFAULT_OBJECTIVES = ([DEFAULT_OBJECTIVE_METRIC], [VAL_LATENT_AMI])
_DEFAULT_ANALYSIS_METRICS = ("latent_nmi", LATENT_AMI)


def _previous_sha256(previous: Path | None, name: str) -> str | None:
    """The hash a first attempt of this sweep resolved ``name`` to (its spec.json), if any."""
    if previous is None or not previous.exists():
        return None
    data = json.loads(previous.read_text()).get("template", {}).get("data", {})
    return data.get("sha256") if data.get("dataset") == name else None


def _previous_base(previous: Path | None, model: str | None) -> str | None:
    """The model hash a first attempt of this sweep resolved ``model`` to, if any."""
    if previous is None or not previous.exists():
        return None
    base = json.loads(previous.read_text()).get("template", {}).get("base", {})
    return base.get("model_sha256") if base.get("model") == model else None


def _label_updates(spec: SweepSpec, name: str) -> dict:
    """Objective and analysis of a label-less dataset (module doc); raises on a named metric."""
    metrics = spec.objective.metrics
    updates: dict = {}
    if metrics in _DEFAULT_OBJECTIVES:
        updates["objective"] = spec.objective.model_copy(update={"metrics": [TEST_ELBO],
                                                                 "modes": None})
    else:
        for metric in metrics:
            if metric in LABEL_METRICS:
                raise DatasetResolutionError(
                    "objective.metrics", f"{metric!r} needs a label: dataset {name!r} {NO_LABEL}; "
                    f"use {TEST_ELBO} (or another loss read-out)")
    analysis = spec.analysis
    changes: dict = {}
    if analysis.metric in LABEL_READOUTS:
        if analysis.metric not in _DEFAULT_ANALYSIS_METRICS:  # a default is replaced, any other refused
            raise DatasetResolutionError(
                "analysis.metric", f"{analysis.metric!r} needs a label: dataset {name!r} "
                f"{NO_LABEL}; use {ELBO}")
        changes["metric"] = ELBO
    if list(analysis.metrics) == list(READOUT_METRICS):
        changes["metrics"] = [ELBO, *(m for m in READOUT_METRICS if m not in LABEL_READOUTS)]
    else:
        for metric in analysis.metrics:
            if metric in LABEL_READOUTS:
                raise DatasetResolutionError(
                    "analysis.metrics", f"{metric!r} needs a label: dataset {name!r} {NO_LABEL}; "
                    "remove it")
    if changes:
        updates["analysis"] = analysis.model_copy(update=changes)
    return updates


def resolve_spec_data(spec: SweepSpec, data_root: Path | str | None,
                      previous: Path | None = None,
                      model_root: Path | str | None = None) -> SweepSpec:
    """The spec with its dataset resolved and checked (module doc); a synthetic spec as is.

    Args:
        spec: the validated sweep spec.
        data_root: the dataset store's folder (the caller's setting).
        previous: a first attempt's ``spec.json``: its resolved hash pins a resumed sweep.
        model_root: the model store's folder, for ``base.kind: causal_lm``.

    Raises:
        DatasetResolutionError: naming the spec field (``template.data.dataset``,
            ``template.data.sha256``, ``template.base.kind``, ``objective.metrics``,
            ``analysis.metric(s)``, ``analysis.primary``) and the fix.
    """
    data = spec.template.data
    if not isinstance(data, DatasetDataConfig):
        if spec.template.base.kind == "causal_lm":
            raise DatasetResolutionError(
                "template.base.kind", "'causal_lm' scores a dataset tokenized by the model's "
                "tokenizer; the synthetic task's ids are not: set template.data.dataset")
        return spec
    pin = data.sha256 or _previous_sha256(previous, data.dataset)
    resolved = resolve_dataset(data.model_copy(update={"sha256": pin}), data_root)
    if data.sha256 is None and pin is not None:
        resolved = resolved.model_copy(update={"sha256": pin})
    columns = dataset_columns(resolved)
    base = spec.template.base.kind
    if base == "oracle":
        raise DatasetResolutionError(
            "template.base.kind", f"'oracle' is the synthetic task's exact model and does not "
            f"exist for dataset {data.dataset!r}; use learned, precomputed or causal_lm")
    if base == "precomputed" and BASE_NLL not in columns:
        raise DatasetResolutionError(
            "template.base.kind", f"'precomputed' reads the base_nll column, which dataset "
            f"{data.dataset!r} does not have; use learned, or register it with base_nll")
    if spec.analysis.primary == "caveat":
        raise DatasetResolutionError(
            "analysis.primary", "'caveat' contrasts the synthetic task's prefix and private "
            f"kinds with the oracle's h_t, which dataset {data.dataset!r} does not have; use "
            "stack_contrasts")
    updates = {} if LABEL in columns else _label_updates(spec, data.dataset)
    record = DatasetStore(Path(str(resolved.root))).get(data.dataset)
    base_config = spec.template.base
    if base_config.kind == "causal_lm" and base_config.model_sha256 is None:
        # A resumed sweep keeps the model content its first attempt resolved.
        old = _previous_base(previous, base_config.model)
        base_config = base_config.model_copy(update={"model_sha256": old})
    base_config = resolve_model(base_config, model_root, dataset_name=data.dataset,
                                dataset_tokenizer=record.tokenizer)
    template = spec.template.model_copy(update={"data": resolved, "base": base_config})
    dumped = spec.model_copy(update={**updates, "template": template}).model_dump(mode="json")
    return SweepSpec.model_validate(dumped)
