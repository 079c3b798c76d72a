"""A cohort: K trials of one shape trained as one vectorized computation on one worker.

Each member is a lone :class:`~workers.train.loop.Trainer` (its own config, seeding, data,
model, history, checkpoints; every epoch-end read-out runs the lone code): the cohort only
replaces the train pass. There the members' parameters are stacked on a leading axis and
one batched forward (workers/models/functional.py) and one backward run per step for all;
each member keeps its own batch order, noise stream, loss stack (losses.py), gradient
clipping and AdamW state (optim.py), and the training phases (phases.py) move its own slices. A member
that diverges fails with the lone trainer's message, one that stops improving leaves; the
others go on, re-stacked without it (or, compiled, kept stacked but masked: compiled.py). Same seed, same config: the same losses as alone.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.func import stack_module_state

from workers.cohort import phases
from workers.cohort.compiled import CompiledStep
from workers.cohort.evaluation import member_gradient_shares, member_outputs
from workers.cohort.grouping import fingerprint
from workers.cohort.losses import group_rate_controls, loss_groups, write_back
from workers.cohort.member import (
    OUTPUTS,
    POSTERIOR_PROBS,
    Member,
    MemberCallback,
    capture,
    check_cohort,
    loss_outputs,
    own_rng,
    per_member,
    train_metrics,
)
from workers.cohort.optim import StackedAdamW, clip_per_member
from workers.contract import VAL_LOSS, TrainingStatus
from workers.models.backbone import upcast
from workers.models.functional import cvae_forward
from workers.train import phases as train_phases
from workers.train.batch_metrics import divergence
from workers.train.config import TrialConfig
from workers.train.loop import Trainer, TrialCheckFailed

SPLIT_FIELDS = ("context", "target", "mask")


class Cohort:
    """Build with :meth:`create`, then :meth:`run` (or :meth:`run_epoch` yourself).

    ``batched_eval``: True runs the epoch ends' forwards for all members at once
    (cohort/evaluation.py), False each member's lone forward; None (default) batches on CUDA
    only (on one CPU thread the lone nn.GRU kernels measured 1.3-1.6x less CPU time).
    ``batched_gradients``: True (default) computes the members' gradient shares together, False
    member by member (on one CPU thread the batched ones took 0.51-0.56x the time).
    """

    batched_eval: bool | None = None
    batched_gradients: bool = True

    def __init__(self, members: list[Member]) -> None:
        self.members = members
        lead = members[0].trainer
        self.device, self.model_config = lead.device, lead.model.config
        self.num_categories = lead.model.num_categories
        self.outputs = loss_outputs(self.model_config)  # what the members' losses may read
        self.step = lead.step
        self._deps: dict[str, frozenset[str]] | None = None
        self._compiled: CompiledStep | None = None  # from_members() sets it when training.compile asks
        self.compile_fallback: str | None = None  # why a compiled cohort trains eagerly
        self._stack()

    @classmethod
    def create(cls, configs: Sequence[TrialConfig], cache_root: Path | str = ".ksweep",
               checkpoints: Mapping[int, Path | str] | None = None) -> Cohort:
        """One lone Trainer per config (resumed from ``checkpoints[i]`` if given), then stacked."""
        return cls.from_members(cls.create_members(configs, cache_root, checkpoints), cache_root)

    @classmethod
    def from_members(cls, members: list[Member], cache_root: Path | str = ".ksweep") -> Cohort:
        """Stack ``members``; compiled when their ``training.compile`` asks for it (compiled.py)."""
        cohort = cls(members)
        cohort._compiled = CompiledStep.create(cohort, members[0].config.training.compile, cache_root)
        return cohort

    @staticmethod
    def create_members(configs: Sequence[TrialConfig], cache_root: Path | str = ".ksweep",
                       checkpoints: Mapping[int, Path | str] | None = None) -> list[Member]:
        """The members' lone trainers, built (and resumed) but not stacked."""
        check_cohort(configs)
        members = []
        for position, config in enumerate(configs):
            trainer = Trainer.create(config, cache_root)
            if checkpoints and checkpoints.get(position):
                trainer.load_checkpoint(checkpoints[position])
            members.append(capture(position, trainer))
        if len({(m.trainer.epoch, m.trainer.step) for m in members}) > 1:
            raise ValueError("cohort members resume from different epochs; resume them alone")
        return members

    @property
    def active(self) -> list[Member]:
        return [m for m in self.members if m.status == TrainingStatus.RUNNING]

    @property
    def epoch(self) -> int:
        return min((m.trainer.epoch for m in self.members), default=0)

    # -- what a compiled step and the phases read (workers/cohort/compiled.py, phases.py) -----

    @property
    def rows(self) -> list[Member]:
        """The stacked members, row by row (row k of every stacked tensor is ``rows[k]``)."""
        return self._rows

    @property
    def train_tensors(self) -> dict[str, torch.Tensor]:
        """The members' train splits stacked, one copy per distinct split: each field of the
        split, ``decoder_input`` and ``base_nll``, ``[S, N, ...]``."""
        return self._data

    @property
    def train_source(self) -> torch.Tensor:
        """``[K]``: which of :attr:`train_tensors`' splits row k trains on."""
        return self._source

    # -- stacking ---------------------------------------------------------------------------

    def _stack(self) -> None:
        """(Re)stack the running members from their trainers (models and AdamW states)."""
        active = self.active
        if not active:
            return
        if self._compiled is not None:  # compiled: members that left stay stacked, masked
            self._eval_cache = {}
            return
        self._rows = active  # the stacked members, row by row
        self.params, _ = stack_module_state([m.trainer.model for m in active])
        as_tensor = lambda values: torch.tensor(values, dtype=torch.float64, device=self.device)  # noqa: E731
        training = [m.config.training for m in active]
        self.max_norm = as_tensor([t.grad_clip if t.grad_clip is not None else math.inf for t in training])
        self.optimizer = StackedAdamW(self.params, as_tensor([t.learning_rate for t in training]),
                                      as_tensor([t.weight_decay for t in training]))
        for index, member in enumerate(active):
            state = member.trainer.optimizer.state
            for name, param in member.trainer.model.named_parameters():
                if param in state and state[param]:
                    self.optimizer.load_member_state(name, index, state[param])
        splits, source = {}, []  # members with the same train split share one stacked copy
        for member in active:
            key = fingerprint(member.trainer.train_data)
            source.append(list(splits).index(key) if key in splits else len(splits))
            splits.setdefault(key, member.trainer.train_data)
        self._source = torch.tensor(source, device=self.device)
        datas = list(splits.values())
        shapes = {tuple(getattr(d.split, f).shape for f in SPLIT_FIELDS) for d in datas}
        if len(shapes) > 1:
            raise ValueError(f"cohort members' train splits differ in shape {sorted(shapes)}; "
                             "give them the same data sizes and lengths")
        self._data = {f: torch.stack([getattr(d.split, f) for d in datas]) for f in SPLIT_FIELDS}
        self._data["decoder_input"] = torch.stack([d.decoder_input for d in datas])
        self._data["base_nll"] = torch.stack([d.base_nll for d in datas])
        self._used_cache: dict[tuple, dict[str, torch.Tensor]] = {}
        self._eval_cache: dict[tuple, Any] = {}

    def _sync_trainers(self) -> None:
        """Write each running member's slice back to its trainer (model and AdamW state)."""
        for member in self.active:
            index, trainer = self._rows.index(member), member.trainer
            trainer.step = trainer.model.step = self.step
            with torch.no_grad():
                for name, param in trainer.model.named_parameters():
                    param.copy_(self.params[name][index])
                    state = self.optimizer.member_state(name, index)
                    if state is not None:
                        trainer.optimizer.state[param] = state

    def _dependencies(self) -> dict[str, frozenset[str]]:
        """Which parameters each model output reaches (static: a property of the model graph)."""
        if self._deps is None:
            probe = {n: p[:1].detach().requires_grad_() for n, p in self.params.items()}
            data = {k: v[:1, :2] for k, v in self._data.items()}
            noise, dropped = self._draws([torch.Generator(self.device)], 2)
            out = cvae_forward(probe, self.model_config, self.num_categories, data["context"],
                               data["decoder_input"], data["target"], data["mask"], noise, 1.0, dropped=dropped)
            names = list(probe)
            self._deps = {}
            for key in self.outputs:
                grads = torch.autograd.grad(out[key].sum(), [probe[n] for n in names],
                                            allow_unused=True, retain_graph=True)
                self._deps[key] = frozenset(n for n, g in zip(names, grads, strict=True) if g is not None)
        return self._deps

    def _used(self, reached: dict[str, list[bool]]) -> dict[str, torch.Tensor]:
        """Per parameter, ``[K]``: did member k's loss reach it (a lone run's grad is not None)."""
        key = tuple(tuple(v) for v in reached.values())
        if key not in self._used_cache:
            deps = self._dependencies()
            self._used_cache[key] = {
                name: torch.tensor([any(reached[o][k] and name in deps[o] for o in self.outputs)
                                    for k in range(len(reached[OUTPUTS[0]]))], device=self.device)
                for name in self.params
            }
        return self._used_cache[key]

    # -- one epoch --------------------------------------------------------------------------

    def _train_pass(self, active: list[Member]):
        """One pass over the train split for all running members; per-member tensors back."""
        if self._compiled is not None:
            return self._compiled.train_pass(active)
        training = active[0].config.training
        groups = loss_groups(active, self._data["target"].shape[1], self.device)
        controls = group_rate_controls(active, groups, self._data["target"].shape[1])  # members' own
        size = self._data["target"].shape[1]
        order = torch.stack([torch.randperm(size, generator=m.trainer.batch_generator) for m in active])
        inject = [m.config.training.inject_nan_at_step for m in active]
        sums = [{} for _ in groups]
        counts = [0 for _ in groups]
        losses: list[list[torch.Tensor]] = [[] for _ in groups]
        terms: list[list[dict[str, torch.Tensor]]] = [[] for _ in groups]
        autocast = (torch.autocast("cuda", dtype=torch.bfloat16)
                    if training.bf16 and self.device.type == "cuda" else contextlib.nullcontext())
        lead = active[0].trainer.model
        if train_phases.resets_decoder(training, active[0].trainer.epoch):
            phases.reset_decoders(self, active)
        batches = order.split(training.batch_size, dim=1)
        for position, part in train_phases.update_plan(len(batches), training, active[0].trainer.epoch):
            indices = batches[position].to(self.device)
            batch = {key: value[self._source.unsqueeze(1), indices] for key, value in self._data.items()}
            lead.step = self.step
            noise, dropped = self._draws([m.generator for m in active], indices.shape[1])
            with autocast:
                out = cvae_forward(self.params, self.model_config, self.num_categories,
                                   batch["context"], batch["decoder_input"], batch["target"],
                                   batch["mask"], noise, lead.gumbel_temperature(), dropped=dropped)
            leaves = [{key: upcast(out[key])[index].detach().requires_grad_() for key in self.outputs}
                      for index, _, _ in groups]
            totals, counted = [], train_phases.counted(part)
            for g, (index, positions, member_loss) in enumerate(groups):
                probs, control = leaves[g].get(POSTERIOR_PROBS), controls[g]
                beta = None if control is None else control[0].beta  # [members]: each its own
                total, term_values, values, count = torch.func.vmap(member_loss, in_dims=(0,) * 6 + (
                    None, None if probs is None else 0, None if beta is None else 0))(
                    leaves[g]["token_nll"], batch["base_nll"][index], batch["mask"][index], leaves[g]["kl"],
                    leaves[g]["bow_logits"], batch["target"][index], self.step, probs, beta)
                if counted and any(inject[k] == self.step for k in positions):
                    total = total * torch.tensor([math.nan if inject[k] == self.step else 1.0
                                                  for k in positions], dtype=total.dtype, device=total.device)
                totals.append(total.sum())
                if not counted:  # an encoder-only update: not a logged step (as alone)
                    continue
                if control is not None and control[1].kl_on(self.step):
                    control[0].update(values["kl"])  # each member's batch rate, as alone
                values["loss"] = total.detach()
                for key, value in values.items():
                    sums[g][key] = sums[g].get(key, 0.0) + value * count
                counts[g] = counts[g] + count
                losses[g].append(total.detach())
                terms[g].append(term_values)
            torch.stack(totals).sum().backward()
            self._backward(out, groups, leaves, len(active), phases.part_names(self.params, part))
            self.step += 1 if counted else 0
        write_back(active, groups, controls)
        return per_member(active, groups, sums, counts, losses, terms)

    _draws = phases.member_draws  # each member's (noise, dropped), from its own stream, as alone

    def _backward(self, out, groups, leaves, members: int, names: list[str] | None = None) -> None:
        """Backpropagate the members' output gradients through the model, clip, step; ``names``:
        only those parameters (an encoder- or decoder-only update; None: all)."""
        reached, tensors, grads = {}, [], []
        for key in self.outputs:
            grad = torch.zeros_like(out[key], dtype=upcast(out[key]).dtype)
            reached[key] = [False] * members
            for (index, positions, _), leaf in zip(groups, leaves, strict=True):
                if leaf[key].grad is not None:
                    grad[index] = leaf[key].grad
                    for k in positions:
                        reached[key][k] = True
            if any(reached[key]):
                tensors.append(out[key])
                grads.append(grad.to(out[key].dtype))
        torch.autograd.backward(tensors, grads, inputs=None if names is None else [self.params[n] for n in names])
        param_grads = {n: p.grad for n, p in self.params.items() if p.grad is not None}
        clip_per_member(param_grads, self.max_norm)
        self.optimizer.step(param_grads, self._used(reached))
        for param in self.params.values():
            param.grad = None

    def run_epoch(self, patience: int | None = None, monitor: str = VAL_LOSS,
                  on_member: Callable[[int, dict[str, float]], None] | None = None) -> dict[int, dict[str, float]]:
        """Train one epoch for every running member, then each one's lone epoch-end code.

        Returns the epoch's metrics by member position (members that failed this epoch are
        absent; their ``status`` is 'failed' and ``error`` says why). With ``patience``, a
        member whose ``monitor`` (minimised) has not improved for that many epochs stops.
        ``on_member(position, metrics)`` runs right after each member's epoch end (its status
        set), before the next member's: what it hands off (a metric write) overlaps the rest.
        """
        active = self.active
        first_step, started = self.step, time.perf_counter()
        sums, counts, losses, terms = self._train_pass(active)
        elapsed = time.perf_counter() - started  # logging point: per-member syncs from here on
        self._sync_trainers()
        batched = self.device.type == "cuda" if self.batched_eval is None else self.batched_eval
        rows = [self._rows.index(m) for m in active]  # compiled: stopped members' rows are skipped
        params = self.params if len(rows) == len(self._rows) else {n: p[rows] for n, p in self.params.items()}
        trainers = [m.trainer for m in active]
        outputs = (member_outputs(params, self.model_config, self.num_categories, trainers, self._eval_cache)
                   if batched else None)
        shares = (member_gradient_shares(params, self.model_config, self.num_categories, trainers,
                                         self._eval_cache) if self.batched_gradients else None)
        results: dict[int, dict[str, float]] = {}
        for k, member in enumerate(active):
            trainer = member.trainer
            diverged = divergence(losses[k], terms[k], first_step, trainer.epoch)
            if diverged is not None:
                self._fail(member, f"TrialDiverged: {diverged}")
                continue
            member.step_losses.extend(losses[k].tolist())
            train = train_metrics(member, sums[k], counts[k], elapsed, len(active), self.step)
            train.update(self._compiled.metrics() if self._compiled is not None else {})
            trainer.train_epoch = lambda metrics=train: metrics  # the lone run_epoch, minus its pass
            if outputs is not None:  # its lone read-outs, on its slice of the batched forward
                trainer.evaluate_split = lambda name, t=trainer, o=outputs[k]: Trainer.evaluate_split(t, name, o[name])
            if shares is not None:  # its gradient shares, from the batched backward
                trainer.gradient_readouts = lambda values=shares[k]: values
            try:
                with own_rng(member):
                    results[member.position] = trainer.run_epoch()
            except TrialCheckFailed as error:
                self._fail(member, f"{type(error).__name__}: {error}")
                continue
            finally:
                del trainer.train_epoch
                trainer.__dict__.pop("evaluate_split", None)
                trainer.__dict__.pop("gradient_readouts", None)
            self._after_epoch(member, results[member.position], patience, monitor)
            if on_member is not None:
                on_member(member.position, results[member.position])
        if len(self.active) != len(active):
            self._stack()
        return results

    def _fail(self, member: Member, reason: str) -> None:
        member.status, member.error = TrainingStatus.FAILED.value, reason

    @staticmethod
    def _after_epoch(member: Member, metrics: dict[str, float], patience: int | None, monitor: str) -> None:
        value, trainer = metrics.get(monitor, math.nan), member.trainer
        if trainer.epoch <= member.config.training.autoencoder_epochs:  # pre-training: not counted
            pass
        elif value < member.best:
            member.best, member.since_best = value, 0
        else:
            member.since_best += 1
        stopped = trainer.selection.stopped  # the lone trainer's own early stopping
        if trainer.epoch >= member.config.training.epochs:
            member.status = TrainingStatus.FINISHED.value
        elif stopped or (patience is not None and member.since_best >= patience):
            member.status = TrainingStatus.STOPPED.value

    def stop(self, member: Member, reason: str = TrainingStatus.STOPPED.value) -> None:
        """Take a running member out (e.g. a scheduler's decision); the others go on."""
        if member.status == TrainingStatus.RUNNING:
            member.status, member.error = TrainingStatus.STOPPED.value, reason
            self._stack()

    def run(self, on_epoch: MemberCallback | None = None, patience: int | None = None,
            monitor: str = VAL_LOSS) -> list[Member]:
        """Train until every member finished, failed or stopped; returns the members.

        ``on_epoch(member, epoch, metrics)`` runs after each member's epoch (report, checkpoint);
        a truthy return stops that member.
        """
        by_position = {m.position: m for m in self.members}
        while self.active:
            for position, metrics in self.run_epoch(patience, monitor).items():
                member = by_position[position]
                if on_epoch is not None and on_epoch(member, member.trainer.epoch, metrics):
                    self.stop(member, "stopped by on_epoch")
        for member in self.members:  # the lone run's end-of-run step, where the trainer has one
            finalize = getattr(member.trainer, "finalize", None)
            if member.status != TrainingStatus.FAILED and finalize is not None:
                with own_rng(member):
                    finalize()
        return self.members

    def save_checkpoint(self, member: Member, path: Path | str) -> Path:
        """The member's lone-trainer checkpoint (a lone Trainer or a cohort can resume from it)."""
        with own_rng(member):
            return member.trainer.save_checkpoint(path)

