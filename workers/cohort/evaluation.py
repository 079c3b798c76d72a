"""A cohort's epoch-end forward: every member's eval-mode outputs on a split in one pass.

The lone epoch end (``Trainer.evaluate``) runs each member's model over its train subset,
val and test one member after another. Here the members' splits are stacked on a leading
member axis and ``cvae_forward(training=False)`` (workers/models/functional.py) runs once
per evaluation batch for all of them; member k's :class:`Collected` then goes to its lone
``Trainer.evaluate_split``, so every read-out (losses, kappa statistics, latent recovery,
mutual information) is computed by the lone code on the same numbers, up to float rounding.
Gradient shares and ``finalize`` stay per member (they need a member's own backward or run
once). The eval forward draws no random numbers, like the lone one.
"""

from __future__ import annotations

import contextlib

import torch

from workers.models.functional import cvae_forward
from workers.readouts.evaluate import Collected, SplitData

MAX_MEMBER_ROWS = 1 << 20  # rows of all members in one eval batch (bounds a K = 1,024 cohort's memory)


def eval_split(data: SplitData, name: str, train_subset: int) -> SplitData:
    """The rows the lone ``evaluate_split(name)`` reads (train: its fixed leading subset)."""
    if name == "train":
        return data.subset(torch.arange(min(len(data.split), train_subset)))
    return data


def stack_splits(datas: list[SplitData]) -> dict[str, torch.Tensor]:
    """``{context, decoder_input, target, mask}`` of K equally shaped splits, each ``[K, N, ...]``.

    Raises ValueError naming the shapes when the members' splits differ in size or length.
    """
    tensors = {"context": [d.split.context for d in datas], "decoder_input": [d.decoder_input for d in datas],
               "target": [d.split.target for d in datas], "mask": [d.split.mask for d in datas]}
    shapes = {tuple(tuple(t[k].shape) for t in tensors.values()) for k in range(len(datas))}
    if len(shapes) > 1:
        raise ValueError(f"cohort members' evaluation splits differ in shape {sorted(shapes)}; "
                         "give them the same data sizes and lengths")
    return {key: torch.stack(values) for key, values in tensors.items()}


@torch.no_grad()
def collect_members(params: dict[str, torch.Tensor], model_config, num_categories: int,
                    stacked: dict[str, torch.Tensor], batch_size: int, bf16: bool) -> list[Collected]:
    """Every member's eval-mode outputs on its stacked split, as ``collect`` gathers a lone one.

    Like ``collect``, every output is cast to float32 (the lone read-outs see the same values);
    rows go in batches of ``batch_size`` per member, fewer when members x rows would pass
    ``MAX_MEMBER_ROWS`` (at least one row).
    """
    members, rows = stacked["target"].shape[:2]
    device = stacked["target"].device
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if bf16 and device.type == "cuda"
                else contextlib.nullcontext())
    parts: dict[str, list[torch.Tensor]] = {}
    for indices in torch.arange(rows, device=device).split(max(1, min(batch_size, MAX_MEMBER_ROWS // members))):
        batch = {key: value[:, indices] for key, value in stacked.items()}
        with autocast:
            out = cvae_forward(params, model_config, num_categories, batch["context"],
                               batch["decoder_input"], batch["target"], batch["mask"], training=False)
        for name in Collected.__dataclass_fields__:
            if name in out:
                parts.setdefault(name, []).append(out[name].float())
    merged = {name: torch.cat(value, dim=1) for name, value in parts.items()}
    return [Collected(**{name: merged[name][k] if name in merged else None
                         for name in Collected.__dataclass_fields__}) for k in range(members)]


def member_outputs(params: dict[str, torch.Tensor], model_config, num_categories: int, trainers: list,
                   cache: dict[tuple, dict[str, torch.Tensor]]) -> list[dict[str, Collected]]:
    """Per running member (``trainers[k]``, row k of ``params``): its outputs on each split its
    lone ``evaluate`` reads, from one batched forward per split and row count.

    Members whose read-out settings differ (``readouts.test``, ``readouts.train_subset``) are
    grouped by what they read. ``cache`` keeps the stacked splits (fixed while the members
    are); the caller empties it when the running members change.
    """
    wanted: dict[tuple, list[int]] = {}
    for k, trainer in enumerate(trainers):
        readouts = trainer.config.readouts
        for name in ("train", "val", "test") if readouts.test else ("train", "val"):
            rows = len(eval_split(trainer.splits[name], name, readouts.train_subset).split)
            wanted.setdefault((name, rows), []).append(k)
    outputs: list[dict[str, Collected]] = [{} for _ in trainers]
    training = trainers[0].config.training
    for (name, rows), members in wanted.items():
        key = (name, rows, tuple(members))
        if key not in cache:
            cache[key] = stack_splits([eval_split(trainers[k].splits[name], name, rows) for k in members])
        index = torch.tensor(members, device=next(iter(params.values())).device)
        chosen = params if len(members) == len(trainers) else {n: p[index] for n, p in params.items()}
        for k, collected in zip(members, collect_members(chosen, model_config, num_categories, cache[key],
                                                         training.eval_batch_size, training.bf16), strict=True):
            outputs[k][name] = collected
    return outputs
