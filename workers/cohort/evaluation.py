"""A cohort's epoch-end forward: every member's eval-mode outputs on a split in one pass.

The members' splits are stacked on a member axis and ``cvae_forward(training=False)`` runs once
per evaluation batch for all of them; member k's :class:`Collected` then goes to its lone
``Trainer.evaluate_split``, so every read-out is the lone code's on the same numbers, up to float
rounding. The gradient shares come from one forward and one backward per token group for all
members (:func:`member_gradient_shares`: members share no parameter). No random numbers are drawn.
"""

from __future__ import annotations

import contextlib
import math

import torch

from objectives import LossInputs
from workers.contract import GRAD_NORM_NAME, grad_share_name
from workers.models.functional import cvae_forward
from workers.readouts.evaluate import Collected
from workers.readouts.gradients import POSTERIOR_PARAMS, settled_share
from workers.readouts.split_data import SplitData, readout_split

MAX_MEMBER_ROWS = 1 << 20  # rows of all members in one eval batch (bounds a K = 1,024 cohort's memory)


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


def _autocast(bf16: bool, device: torch.device):
    return (torch.autocast("cuda", dtype=torch.bfloat16) if bf16 and device.type == "cuda"
            else contextlib.nullcontext())


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
    autocast = _autocast(bf16, device)
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

    Members whose read-out settings differ (``readouts.epoch_splits()``, ``readouts.train_subset``) are
    grouped by what they read. ``cache`` keeps the stacked splits (fixed while the members
    are); the caller empties it when the running members change.
    """
    wanted: dict[tuple, list[int]] = {}
    for k, trainer in enumerate(trainers):
        readouts = trainer.config.readouts
        for name in readouts.epoch_splits():
            rows = len(readout_split(trainer.splits[name], name, readouts.train_subset).split)
            wanted.setdefault((name, rows), []).append(k)
    outputs: list[dict[str, Collected]] = [{} for _ in trainers]
    training = trainers[0].config.training
    for (name, rows), members in wanted.items():
        key = (name, rows, tuple(members))
        if key not in cache:
            cache[key] = stack_splits([readout_split(trainers[k].splits[name], name, rows) for k in members])
        index = torch.tensor(members, device=next(iter(params.values())).device)
        chosen = params if len(members) == len(trainers) else {n: p[index] for n, p in params.items()}
        for k, collected in zip(members, collect_members(chosen, model_config, num_categories, cache[key],
                                                         training.eval_batch_size, training.bf16), strict=True):
            outputs[k][name] = collected
    return outputs


def member_gradient_shares(params: dict[str, torch.Tensor], model_config, num_categories: int,
                           trainers: list, cache: dict[tuple, object]) -> list[dict[str, float]]:
    """Per running member (``trainers[k]``, row k of ``params``): its lone
    ``Trainer.gradient_readouts()``, from one batched forward on the members' gradient batches
    (``Trainer.gradient_batch``) and one backward per token group for all of them; the host
    reads the results once per group. Members with the same batch size go together; ``cache``
    keeps their stacked batches (fixed while the members are), as for :func:`member_outputs`."""
    key = ("gradient batches", len(trainers))
    if key not in cache:
        together: dict[int, list[tuple[int, tuple]]] = {}
        for k, trainer in enumerate(trainers):
            if (batch := trainer.gradient_batch()) is not None:
                together.setdefault(len(batch[0].split), []).append((k, batch))
        cache[key] = [([k for k, _ in rows], [b for _, b in rows], stack_splits([b[0] for _, b in rows]))
                      for rows in together.values()]
    results: list[dict[str, float]] = [{} for _ in trainers]
    for members, batches, stacked in cache[key]:
        index = torch.tensor(members, device=next(iter(params.values())).device)
        chosen = params if len(members) == len(trainers) else {n: p[index] for n, p in params.items()}
        shares = _shares_together(chosen, model_config, num_categories, [trainers[k] for k in members],
                                  stacked, batches)
        for k, values in zip(members, shares, strict=True):
            results[k] = values
    return results


def _shares_together(params: dict[str, torch.Tensor], model_config, num_categories: int, trainers: list,
                     stacked: dict[str, torch.Tensor], batches: list) -> list[dict[str, float]]:
    """:func:`member_gradient_shares` for members of one gradient batch size (row i: ``trainers[i]``,
    whose ``gradient_batch()`` is ``batches[i]``)."""
    inputs = {name: value.detach() for name, value in params.items()}
    leaves = [inputs[name].requires_grad_() for name in inputs if name.startswith(POSTERIOR_PARAMS)]
    stacks = [t.build_stack(recon) for t, (_, _, recon) in zip(trainers, batches, strict=True)]
    results: list[dict[str, float]] = [{} for _ in trainers]
    with torch.enable_grad():
        with _autocast(trainers[0].config.training.bf16, stacked["target"].device):
            out = cvae_forward(inputs, model_config, num_categories, stacked["context"],
                               stacked["decoder_input"], stacked["target"], stacked["mask"], training=False)
        token_nll = out["token_nll"].float()

        def grad_of(weights: dict[int, torch.Tensor | None]) -> list[torch.Tensor]:
            """The gradient of the summed losses of the rows in ``weights`` (row i's token
            losses times its weight; None: all of them), on every row."""
            total = sum(stacks[i](LossInputs(token_nll[i] if w is None else token_nll[i] * w,
                                             batches[i][0].base_nll, batches[i][0].split.mask)).total
                        for i, w in weights.items())
            grads = torch.autograd.grad(total, leaves, retain_graph=True, allow_unused=True)
            return [torch.zeros_like(p) if g is None else g for p, g in zip(leaves, grads, strict=True)]

        def dot(a: list[torch.Tensor], b: list[torch.Tensor]) -> list[float]:
            """Each row's inner product over all parameters, in float64 (as the lone one)."""
            return sum((x.double() * y.double()).flatten(1).sum(1) for x, y in zip(a, b, strict=True)).tolist()

        total = grad_of(dict.fromkeys(range(len(trainers))))
        norm2 = dot(total, total)
        for i in range(len(trainers)):
            results[i][GRAD_NORM_NAME] = math.sqrt(norm2[i])
        for name in dict.fromkeys(name for _, groups, _ in batches for name in groups):
            rows = [i for i, (_, groups, _) in enumerate(batches) if name in groups]
            # Per row: does the group hold any token, and is it the whole batch? (one host read)
            flags = torch.stack([torch.stack([groups[name].any(), (groups[name].to(token_nll.dtype)
                                              == data.split.mask.to(token_nll.dtype)).all()])
                                 for data, groups, _ in (batches[i] for i in rows)]).tolist()
            share = grad_share_name(name)
            weights: dict[int, torch.Tensor | None] = {}
            for i, (anything, whole) in zip(rows, flags, strict=True):
                settled = settled_share(norm2[i], anything, whole)
                if settled is None:
                    weights[i] = batches[i][1][name].to(token_nll.dtype)
                else:
                    results[i][share] = settled
            if weights:
                dots = dot(grad_of(weights), total)
                for i in weights:
                    results[i][share] = dots[i] / norm2[i]
    return results
