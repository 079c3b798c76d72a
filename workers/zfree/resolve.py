"""Resolve ``base: {kind: causal_lm, model: NAME}`` once per sweep (torch-free).

Like a dataset name, a model name becomes the content hash it points at now (or the pin is
checked) plus the store root the caller passes (``KSWEEP_MODEL_ROOT``); every trial of the
sweep then loads the same files even if the name is moved meanwhile. The dataset's recorded
tokenizer is checked against the model's here, so a mismatch stops the sweep before any trial.
"""

from __future__ import annotations

from pathlib import Path

from workers.datasets.resolve import DatasetResolutionError
from workers.lm.registry import ModelError, ModelNotFound, ModelStore, check_dataset_tokenizer
from workers.models.config import BaseModelConfig


def resolve_model(base: BaseModelConfig, root: Path | str | None, *, dataset_name: str,
                  dataset_tokenizer: str | None, field: str = "template.base") -> BaseModelConfig:
    """The base config with ``model_sha256`` and ``model_root`` set (``causal_lm`` only).

    Raises:
        DatasetResolutionError: no store root; no model of that name (``{field}.model``); the
            pin differs (``{field}.model_sha256``, naming both); the dataset was tokenized by
            another tokenizer (``{field}.model``, naming both).
    """
    if base.kind != "causal_lm":
        return base
    if root is None:
        raise DatasetResolutionError(f"{field}.model", f"model {base.model!r} needs a model "
                                     "store; set KSWEEP_MODEL_ROOT (default $KSWEEP_SWEEP_ROOT/models)")
    store = ModelStore(root)
    try:
        record = store.get(str(base.model))
    except ModelNotFound as error:
        raise DatasetResolutionError(f"{field}.model", str(error)) from None
    if base.model_sha256 is not None and base.model_sha256 != record.sha256:
        raise DatasetResolutionError(
            f"{field}.model_sha256", f"pinned {base.model_sha256} but model {base.model!r} holds "
            f"{record.sha256}; pin the new hash, or register the pinned files under another name")
    try:
        check_dataset_tokenizer(dataset_name, dataset_tokenizer, record)
    except ModelError as error:
        raise DatasetResolutionError(f"{field}.model", str(error)) from None
    return base.model_copy(update={"model_sha256": record.sha256,
                                   "model_root": str(store.root)})
