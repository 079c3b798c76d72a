"""The z-free base model: the exact oracle, or a learned decoder cached on disk.

The learned base model is trained once per (data config, base config) and stored
content-addressed by a hash of both, so every trial of a sweep (and every sweep
on the same data) shares it. c_base (ReferenceScale over the train split) is
stored beside it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from filelock import FileLock

from objectives import ReferenceScale
from workers.adamw import AdamW
from workers.data import SyntheticSplit, SyntheticTaskConfig, generate_task, oracle_base_nll
from workers.models import BaseDecoder, ModelConfig
from workers.models.config import BaseModelConfig

if TYPE_CHECKING:
    from workers.datasets.source import DatasetTask

BASE_CACHE_VERSION = 1


@dataclass(frozen=True)
class BaseSurprisal:
    """b_t on both splits plus c_base.

    Attributes:
        train_nll, val_nll: ``[N, T]`` float32 surprisal, 0 off the mask.
        c_base: mean over train examples of b_u.
        kind: 'oracle' or 'learned'.
        cache_hit: True when a learned model was loaded rather than trained.
        cache_path: the learned model's cache folder (None for the oracle).
    """

    train_nll: torch.Tensor
    val_nll: torch.Tensor
    c_base: float
    kind: str
    cache_hit: bool = False
    cache_path: Path | None = None


def base_cache_key(data: SyntheticTaskConfig, base: BaseModelConfig) -> str:
    """Content address of a learned base model: a hash of both configs and the format version."""
    payload = json.dumps(
        {"data": data.model_dump(mode="json"), "base": base.model_dump(mode="json"),
         "version": BASE_CACHE_VERSION},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


def c_base_of(split: SyntheticSplit, nll: torch.Tensor) -> float:
    scale = ReferenceScale()
    scale.update(nll, split.mask, validate=True)
    return scale.compute()


def _train_learned(
    config: BaseModelConfig, vocab_size: int, train: SyntheticSplit, device: torch.device
) -> BaseDecoder:
    torch.manual_seed(config.seed)
    model = BaseDecoder(
        ModelConfig(embedding_dim=config.embedding_dim, hidden_dim=config.hidden_dim,
                    num_layers=config.num_layers),
        vocab_size,
    ).to(device)
    # 0.01: torch.optim.AdamW's default, which every cached base was trained with.
    optimizer = AdamW(model.parameters(), lr=config.learning_rate, weight_decay=0.01)
    generator = torch.Generator().manual_seed(config.seed)
    train = train.to(device)
    decoder_input = train.decoder_input()
    mask = train.mask.float()
    for _ in range(config.epochs):
        for indices in torch.randperm(len(train), generator=generator).split(config.batch_size):
            indices = indices.to(device)
            nll = model(train.context[indices], decoder_input[indices], train.target[indices])
            loss = (nll * mask[indices]).sum() / mask[indices].sum().clamp_min(1)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
    return model.eval()


@torch.no_grad()
def _evaluate(model: BaseDecoder, split: SyntheticSplit, device: torch.device) -> torch.Tensor:
    split = split.to(device)
    decoder_input = split.decoder_input()
    chunks = [
        model(split.context[i:i + 1024], decoder_input[i:i + 1024], split.target[i:i + 1024])
        for i in range(0, len(split), 1024)
    ]
    return torch.where(split.mask, torch.cat(chunks), 0.0).float().cpu()


def score_split(
    data: SyntheticTaskConfig | DatasetTask, surprisal: BaseSurprisal, split: SyntheticSplit,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """b_t of another split (e.g. test) from the same base model: the oracle, or the cached
    learned decoder that produced ``surprisal`` (for a dataset's ``data``, only its vocabulary
    size is read). ``[N, T]`` float32 on the CPU."""
    if surprisal.kind == "oracle":
        assert isinstance(data, SyntheticTaskConfig)
        return oracle_base_nll(data, split)
    meta = json.loads((surprisal.cache_path / "meta.json").read_text())
    base = BaseModelConfig.model_validate(meta["base"])
    model = BaseDecoder(
        ModelConfig(embedding_dim=base.embedding_dim, hidden_dim=base.hidden_dim,
                    num_layers=base.num_layers),
        data.vocab_size,
    ).to(device)
    model.load_state_dict(torch.load(surprisal.cache_path / "model.pt", map_location=device))
    return _evaluate(model.eval(), split, torch.device(device))


def load_or_train_base(
    data: SyntheticTaskConfig,
    base: BaseModelConfig,
    cache_root: Path | str,
    device: torch.device | str = "cpu",
    splits: tuple[SyntheticSplit, SyntheticSplit] | None = None,
) -> BaseSurprisal:
    """b_t for the train and val splits and c_base, from the oracle or the learned model.

    The learned model is trained at most once per cache key: concurrent trials wait on
    a file lock and the first one's result is reused; the folder is written to a
    temporary name and renamed, so a crash never leaves a half-written cache entry.
    """
    train, val = splits if splits is not None else generate_task(data)
    if base.kind == "oracle":
        train_nll, val_nll = oracle_base_nll(data, train), oracle_base_nll(data, val)
        return BaseSurprisal(train_nll, val_nll, c_base_of(train, train_nll), "oracle")

    return learned_base(base_cache_key(data, base), {"data": data.model_dump(mode="json")}, base,
                        data.vocab_size, train, val, cache_root, device)


def learned_base(
    key: str, describe: dict, base: BaseModelConfig, vocab_size: int, train: SyntheticSplit,
    val: SyntheticSplit, cache_root: Path | str, device: torch.device | str = "cpu",
) -> BaseSurprisal:
    """The learned z-free decoder of cache entry ``key``, trained on ``train`` only if absent.

    The model is trained at most once per key: concurrent trials wait on a file lock and
    the first one's result is reused; the folder is written to a temporary name and
    renamed, so a crash never leaves a half-written entry. ``describe`` goes to meta.json.
    """
    root = Path(cache_root).resolve() / "base_models"
    root.mkdir(parents=True, exist_ok=True)
    target = root / key
    with FileLock(root / f"{key}.lock"):
        if not (target / "meta.json").exists():
            started = time.perf_counter()
            device = torch.device(device)
            model = _train_learned(base, vocab_size, train, device)
            train_nll, val_nll = _evaluate(model, train, device), _evaluate(model, val, device)
            staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root))
            torch.save(model.state_dict(), staging / "model.pt")
            torch.save({"train": train_nll, "val": val_nll}, staging / "base_nll.pt")
            meta = {
                "key": key, "c_base": c_base_of(train, train_nll),
                "train_seconds": time.perf_counter() - started, "train_rows": len(train),
                **describe, "base": base.model_dump(mode="json"), "vocab_size": vocab_size,
                "format_version": BASE_CACHE_VERSION,
            }
            (staging / "meta.json").write_text(json.dumps(meta, indent=2))
            if target.exists():  # a stale folder without meta.json (crash before rename)
                shutil.rmtree(target)
            os.replace(staging, target)
            hit = False
        else:
            hit = True
    meta = json.loads((target / "meta.json").read_text())
    tensors = torch.load(target / "base_nll.pt")
    return BaseSurprisal(tensors["train"], tensors["val"], float(meta["c_base"]), "learned", hit, target)
