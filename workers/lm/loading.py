"""Loading a registered model and its tokenizer: offline, no remote code, float32 by default.

``HF_HUB_OFFLINE`` and ``TRANSFORMERS_OFFLINE`` are set by :func:`offline_transformers` before
transformers is first imported (transformers reads them at import time), and every
``from_pretrained`` call passes ``local_files_only=True`` and ``trust_remote_code=False``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from workers.lm.registry import ModelError, ModelRecord, ModelStore

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "HF_HUB_DISABLE_TELEMETRY": "1"}


def offline_transformers() -> ModuleType:
    """Import transformers with the hub switched off.

    Raises:
        ModelError: transformers was already imported without ``HF_HUB_OFFLINE=1`` (its hub
            client has read the environment already), or it is not installed.
    """
    already = "transformers" in sys.modules
    if already and os.environ.get("HF_HUB_OFFLINE") != "1":
        raise ModelError("transformers was imported before HF_HUB_OFFLINE=1 was set; import "
                         "workers.lm.loading first (or export HF_HUB_OFFLINE=1)")
    for key, value in OFFLINE_ENV.items():
        os.environ[key] = value
    hub = sys.modules.get("huggingface_hub.constants")
    if hub is not None:  # imported earlier (e.g. by `datasets`): it read the variable already
        hub.HF_HUB_OFFLINE = True
    try:
        import transformers
    except ImportError as error:  # pragma: no cover - the lm extra is missing
        raise ModelError("causal_lm bases need transformers: pip install 'kappa-sweep[lm]'") from error
    return transformers


def _pretrained_args(folder: Path, gguf_file: str | None) -> dict[str, Any]:
    args: dict[str, Any] = {"local_files_only": True, "trust_remote_code": False}
    if gguf_file is not None:
        args["gguf_file"] = gguf_file
    return args


def load_tokenizer(folder: Path | str, gguf_file: str | None = None) -> Any:
    """The tokenizer of a model folder (or of a GGUF file in it), offline."""
    transformers = offline_transformers()
    return transformers.AutoTokenizer.from_pretrained(
        str(folder), **_pretrained_args(Path(folder), gguf_file))


def load_model(folder: Path | str, gguf_file: str | None = None, *, device: str = "cpu",
               dtype: str = "float32") -> Any:
    """The causal LM of a folder (GGUF weights are de-quantized to ``dtype``), in eval mode.

    Raises:
        ModelError: the folder needs remote code or is not a causal LM (named, with the fix).
    """
    transformers = offline_transformers()
    import torch

    args = _pretrained_args(Path(folder), gguf_file)
    if gguf_file is None:
        args["use_safetensors"] = True  # never fall back to a pickle file
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(folder), dtype=getattr(torch, dtype), **args)
    except ValueError as error:
        raise ModelError(f"{folder}: cannot load as a causal language model without remote "
                         f"code ({error})") from error
    return model.to(device).eval()


def load_registered(store: ModelStore, record: ModelRecord, *, device: str = "cpu",
                    dtype: str = "float32") -> tuple[Any, Any]:
    """(model, tokenizer) of a registered model, from the store's copy."""
    folder = store.model_path(record)
    return (load_model(folder, record.gguf_file, device=device, dtype=dtype),
            load_tokenizer(folder, record.gguf_file))


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """sha256 of what token ids mean: the vocabulary (token -> id, added tokens included) and
    the special tokens' ids. The same tokenizer loaded from a GGUF file or from a folder has
    the same fingerprint; a tokenizer that maps any id to another string has another."""
    payload = {
        "vocab": sorted(tokenizer.get_vocab().items(), key=lambda item: item[1]),
        "special": {k: tokenizer.convert_tokens_to_ids(v) if isinstance(v, str) else None
                    for k, v in sorted(tokenizer.special_tokens_map.items())},
    }
    return hashlib.sha256(json.dumps(payload, ensure_ascii=False).encode()).hexdigest()


def fingerprint_files(folder: Path, gguf_file: str | None) -> tuple[str, int | None]:
    """(tokenizer fingerprint, vocabulary size) of a model's files, for ModelStore.add.

    The vocabulary size is the config's ``vocab_size`` (the logits' width) when a config.json
    is there, else the tokenizer's length.
    """
    tokenizer = load_tokenizer(folder, gguf_file)
    vocab: int | None = len(tokenizer)
    config = Path(folder) / "config.json"
    if gguf_file is None and config.is_file():
        vocab = int(json.loads(config.read_text()).get("vocab_size", vocab))
    return tokenizer_fingerprint(tokenizer), vocab


def bos_token_id(model: Any, tokenizer: Any) -> int:
    """The id the first target token is conditioned on when x is empty.

    The tokenizer's BOS if it has one, else the model config's ``bos_token_id``, else EOS
    (GPT-2's convention: its documents are separated by EOS).

    Raises:
        ModelError: none of the three is defined.
    """
    for candidate in (getattr(tokenizer, "bos_token_id", None),
                      getattr(model.config, "bos_token_id", None),
                      getattr(tokenizer, "eos_token_id", None)):
        if isinstance(candidate, int):
            return candidate
    raise ModelError("the model's tokenizer defines neither a BOS nor an EOS token: give the "
                     "examples a non-empty x (the context the first y token is conditioned on)")
