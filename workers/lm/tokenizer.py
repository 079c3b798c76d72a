"""A registered model's tokenizer as the dataset store's text tokenizer.

``canonicalize(table, ..., tokenizer=ModelTextTokenizer.of(store, record))`` turns
``x_text`` / ``y_text`` into the model's ids, and ``DatasetStore.add(..., tokenizer=tok.name)``
records ``<model name>@<tokenizer fingerprint>``, which
:func:`workers.lm.surprisal.check_dataset_tokenizer` compares with the model's at use.

No special token is added: ids are the text's alone (SmolLM2's tokenizer adds none either);
the BOS an empty x is replaced by is the surprisal code's business.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from workers.lm.loading import load_tokenizer, tokenizer_fingerprint
from workers.lm.registry import ModelError, ModelRecord, ModelStore


class ModelTextTokenizer:
    """Implements ``workers.datasets.table.TextTokenizer`` with a Hugging Face tokenizer.

    Attributes:
        name: ``<label>@<fingerprint>``, what the dataset record keeps.
    """

    def __init__(self, tokenizer: Any, label: str) -> None:
        self._tokenizer = tokenizer
        self.fingerprint = tokenizer_fingerprint(tokenizer)
        self.name = f"{label}@{self.fingerprint}"

    @classmethod
    def of(cls, store: ModelStore, record: ModelRecord) -> ModelTextTokenizer:
        """The tokenizer of a registered model (offline)."""
        return cls(load_tokenizer(store.model_path(record), record.gguf_file), record.name)

    @classmethod
    def registered(cls, model_root: Path | str, name: str) -> ModelTextTokenizer:
        """The tokenizer of the model registered as ``name`` under ``model_root``, checked
        against the fingerprint taken at registration.

        Raises:
            ModelError: no such model (naming what is registered), or its tokenizer now reads
                differently from the one fingerprinted at registration.
        """
        store = ModelStore(model_root)
        record = store.get(name)
        tokenizer = cls.of(store, record)
        if record.tokenizer_sha256 is not None and tokenizer.fingerprint != record.tokenizer_sha256:
            raise ModelError(f"model {name!r}: its tokenizer reads as {tokenizer.fingerprint[:12]}, "
                             f"not the {record.tokenizer_sha256[:12]} fingerprinted at registration; "
                             f"register it again (`ksweep model add PATH --name {name} --replace`)")
        return tokenizer

    @classmethod
    def from_folder(cls, folder: Path | str, gguf_file: str | None = None,
                    label: str | None = None) -> ModelTextTokenizer:
        """The tokenizer of a model folder (or of a GGUF file in it), offline."""
        return cls(load_tokenizer(folder, gguf_file), label or Path(folder).name)

    def encode(self, texts: pa.Array) -> pa.Array:
        """One list<int64> of ids per string; "" gives an empty list."""
        ids = self._tokenizer(texts.to_pylist(), add_special_tokens=False).input_ids
        return pa.array(ids, type=pa.list_(pa.int64()))
