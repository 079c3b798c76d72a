"""A cohort: K trials of one shape trained as one vectorized computation on one worker.

Each member is a lone :class:`~workers.train.loop.Trainer` (built by ``Trainer.create``
from its own config: seeding, data, base model, model init, kappa summaries), so it keeps
its own model, history and checkpoints, and every epoch-end read-out runs the lone code:
the cohort only replaces the train pass. There the members' parameters are stacked on a
leading axis and one batched forward (workers/models/functional.py) and one backward run
per step for all of them; each member draws its own batch order from its own generator,
its own noise from its own stream, computes its own loss stack (its mean; the members'
losses are summed for the backward, which leaves them independent), is clipped by its own
gradient norm and stepped by its own AdamW state (cohort_optim.py). A member that
diverges fails with the lone trainer's message, one that stops improving leaves; the
others go on, re-stacked without it. Same seed, same config: the same losses as alone.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.func import stack_module_state

from objectives import LossInputs
from workers.cohorts import cohort_key, cohort_problem
from workers.models import CVAEOutput
from workers.models.backbone import upcast
from workers.models.functional import cvae_forward
from workers.train.cohort_optim import StackedAdamW, clip_per_member
from workers.train.config import TrialConfig
from workers.train.loop import Trainer, TrialCheckFailed

OUTPUTS = ("token_nll", "kl", "bow_logits")
SPLIT_FIELDS = ("context", "target", "mask")


@dataclass
class Member:
    """One trial of a cohort. ``status``: running | finished | failed | stopped."""

    position: int  # index in the configs the cohort was made from
    trainer: Trainer
    generator: torch.Generator  # the stream of the forward's noise (the lone trial's torch RNG)
    host_rng: tuple  # (python, numpy, torch CPU) states, swapped in around its evaluation
    status: str = "running"
    error: str | None = None
    step_losses: list[float] = field(default_factory=list)  # every step's training loss
    best: float = math.inf
    since_best: int = 0

    @property
    def config(self) -> TrialConfig:
        return self.trainer.config


MemberCallback = Callable[[Member, int, dict[str, float]], object]


def _capture(position: int, trainer: Trainer) -> Member:
    """Freeze the RNG streams a lone run of ``trainer`` would go on with."""
    cpu = torch.get_rng_state()
    if trainer.device.type == "cpu":
        generator = torch.Generator()
        generator.set_state(cpu)
    else:  # the lone run's CUDA stream is fresh after seed_everything (init happens on CPU)
        generator = torch.Generator(trainer.device).manual_seed(trainer.config.seed)
    return Member(position, trainer, generator, (random.getstate(), np.random.get_state(), cpu))


@contextlib.contextmanager
def _own_rng(member: Member):
    """Run with the member's host RNG states as the global ones (its lone run's), then save them."""
    saved = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    python, numpy_state, cpu = member.host_rng
    on_cpu = member.trainer.device.type == "cpu"
    random.setstate(python)
    np.random.set_state(numpy_state)
    torch.set_rng_state(member.generator.get_state() if on_cpu else cpu)
    try:
        yield
    finally:
        cpu = torch.get_rng_state()
        if on_cpu:
            member.generator.set_state(cpu)
        member.host_rng = (random.getstate(), np.random.get_state(), cpu)
        random.setstate(saved[0])
        np.random.set_state(saved[1])
        torch.set_rng_state(saved[2])


def check_cohort(configs: Sequence[TrialConfig]) -> None:
    """Raise ValueError unless ``configs`` may train as one cohort."""
    if not configs:
        raise ValueError("a cohort needs at least one trial config")
    problems = [cohort_problem(c) for c in configs] if len(configs) > 1 else []
    for index, problem in enumerate(problems):
        if problem:
            raise ValueError(f"cohort member {index}: {problem}")
    first = cohort_key(configs[0])
    for index, config in enumerate(configs[1:], start=1):
        if cohort_key(config) != first:
            raise ValueError(
                f"cohort member {index} differs from member 0 in a shape or budget field (data "
                "except seed, base, model, or training besides learning_rate, weight_decay, "
                "grad_clip); group trials with workers.cohorts.group_cohorts"
            )


class Cohort:
    """Build with :meth:`create`, then :meth:`run` (or :meth:`run_epoch` yourself)."""

    def __init__(self, members: list[Member]) -> None:
        self.members = members
        lead = members[0].trainer
        self.device, self.model_config = lead.device, lead.model.config
        self.num_categories = lead.model.num_categories
        self.step = lead.step
        self._deps: dict[str, frozenset[str]] | None = None
        self._stack()

    @classmethod
    def create(cls, configs: Sequence[TrialConfig], cache_root: Path | str = ".ksweep",
               checkpoints: Mapping[int, Path | str] | None = None) -> Cohort:
        """One lone Trainer per config (resumed from ``checkpoints[i]`` if given), then stacked."""
        check_cohort(configs)
        members, shared = [], {}
        for position, config in enumerate(configs):
            trainer = Trainer.create(config, cache_root)
            if checkpoints and checkpoints.get(position):
                trainer.load_checkpoint(checkpoints[position])
            data = shared.setdefault(config.data, (trainer.train_data, trainer.val_data))
            trainer.train_data, trainer.val_data = data  # identical, so kept once
            members.append(_capture(position, trainer))
        if len({(m.trainer.epoch, m.trainer.step) for m in members}) > 1:
            raise ValueError("cohort members resume from different epochs; resume them alone")
        return cls(members)

    @property
    def active(self) -> list[Member]:
        return [m for m in self.members if m.status == "running"]

    @property
    def epoch(self) -> int:
        return min((m.trainer.epoch for m in self.members), default=0)

    # -- stacking ---------------------------------------------------------------------------

    def _stack(self) -> None:
        """(Re)stack the running members from their trainers (models and AdamW states)."""
        active = self.active
        if not active:
            return
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
        splits = {}
        for member in active:
            splits.setdefault(id(member.trainer.train_data), member.trainer.train_data)
        order = list(splits)
        self._source = torch.tensor([order.index(id(m.trainer.train_data)) for m in active],
                                    device=self.device)
        datas = list(splits.values())
        shapes = {tuple(getattr(d.split, f).shape for f in SPLIT_FIELDS) for d in datas}
        if len(shapes) > 1:
            raise ValueError(f"cohort members' train splits differ in shape {sorted(shapes)}; "
                             "give them the same data sizes and lengths")
        self._data = {f: torch.stack([getattr(d.split, f) for d in datas]) for f in SPLIT_FIELDS}
        self._data["decoder_input"] = torch.stack([d.decoder_input for d in datas])
        self._data["base_nll"] = torch.stack([d.base_nll for d in datas])
        self._used_cache: dict[tuple, dict[str, torch.Tensor]] = {}

    def _sync_trainers(self) -> None:
        """Write each running member's slice back to its trainer (model and AdamW state)."""
        for index, member in enumerate(self.active):
            trainer = member.trainer
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
            out = cvae_forward(probe, self.model_config, self.num_categories, data["context"],
                               data["decoder_input"], data["target"], data["mask"],
                               self._noise([torch.Generator(self.device)], 2), 1.0)
            names = list(probe)
            self._deps = {}
            for key in OUTPUTS:
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
                name: torch.tensor([any(reached[o][k] and name in deps[o] for o in OUTPUTS)
                                    for k in range(len(self.active))], device=self.device)
                for name in self.params
            }
        return self._used_cache[key]

    def _noise(self, generators: list[torch.Generator], batch: int) -> torch.Tensor | None:
        """Each member's draws, from its own stream, as its lone forward would make them."""
        config, dtype = self.model_config, upcast(next(iter(self.params.values()))).dtype
        if self.members[0].config.training.bf16 and self.device.type == "cuda":
            dtype = torch.float32
        if config.family == "continuous":
            return torch.stack([torch.randn((batch, config.latent_dim), dtype=dtype, device=self.device,
                                            generator=g) for g in generators])
        if config.discrete_estimator == "gumbel":
            return torch.stack([-torch.empty((batch, self.num_categories), dtype=dtype, device=self.device)
                                .exponential_(generator=g).log() for g in generators])
        return None

    # -- one epoch --------------------------------------------------------------------------

    def _train_pass(self, active: list[Member]):
        """One pass over the train split for all running members; per-member tensors back."""
        training = active[0].config.training
        stacks = [m.trainer._stacks() for m in active]
        size = self._data["target"].shape[1]
        order = torch.stack([torch.randperm(size, generator=m.trainer._generator) for m in active])
        sums: list[dict[str, torch.Tensor]] = [{} for _ in active]
        counts = [torch.zeros((), dtype=torch.long, device=self.device) for _ in active]
        losses: list[list[torch.Tensor]] = [[] for _ in active]
        terms: list[list[dict[str, torch.Tensor]]] = [[] for _ in active]
        autocast = (torch.autocast("cuda", dtype=torch.bfloat16)
                    if training.bf16 and self.device.type == "cuda" else contextlib.nullcontext())
        lead = active[0].trainer.model
        for indices in order.split(training.batch_size, dim=1):
            indices = indices.to(self.device)
            rows = self._source.unsqueeze(1)
            batch = {key: value[rows, indices] for key, value in self._data.items()}
            lead.step = self.step
            with autocast:
                out = cvae_forward(self.params, self.model_config, self.num_categories,
                                   batch["context"], batch["decoder_input"], batch["target"],
                                   batch["mask"], self._noise([m.generator for m in active], indices.shape[1]),
                                   lead.gumbel_temperature())
            leaves = {key: [value.detach().requires_grad_() for value in upcast(out[key]).unbind(0)]
                      for key in OUTPUTS}
            totals = []
            for k, member in enumerate(active):
                stack, diagnostics = stacks[k]
                inputs = LossInputs(
                    token_nll=leaves["token_nll"][k], base_nll=batch["base_nll"][k], mask=batch["mask"][k],
                    kl=leaves["kl"][k], bow_logits=leaves["bow_logits"][k], targets=batch["target"][k],
                    step=self.step,
                )
                stack_out = stack(inputs)
                loss = stack_out.total
                if member.config.training.inject_nan_at_step == self.step:
                    loss = loss * float("nan")
                totals.append(loss)
                with torch.no_grad():
                    diag_out = diagnostics(LossInputs(inputs.token_nll.detach(), inputs.base_nll, inputs.mask))
                    output = CVAEOutput(inputs.token_nll, inputs.kl, inputs.bow_logits)
                    values, count = Trainer._batch_values(stack_out, diag_out, output, inputs.mask)
                    values["loss"] = loss.detach()
                    for key, value in values.items():
                        sums[k][key] = sums[k].get(key, 0.0) + value * count
                    counts[k] = counts[k] + count
                losses[k].append(loss.detach())
                terms[k].append({key: v.detach() for key, v in stack_out.terms.items()})
            torch.stack(totals).sum().backward()
            reached, tensors, grads = {}, [], []
            for key in OUTPUTS:
                reached[key] = [leaf.grad is not None for leaf in leaves[key]]
                if any(reached[key]):
                    tensors.append(out[key])
                    grads.append(torch.stack([leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
                                              for leaf in leaves[key]]).to(out[key].dtype))
            torch.autograd.backward(tensors, grads)
            param_grads = {n: p.grad for n, p in self.params.items() if p.grad is not None}
            clip_per_member(param_grads, self.max_norm)
            self.optimizer.step(param_grads, self._used(reached))
            for param in self.params.values():
                param.grad = None
            self.step += 1
        return sums, counts, losses, terms

    def run_epoch(self, patience: int | None = None, monitor: str = "val/loss") -> dict[int, dict[str, float]]:
        """Train one epoch for every running member, then each one's lone epoch-end code.

        Returns the epoch's metrics by member position (members that failed this epoch are
        absent; their ``status`` is 'failed' and ``error`` says why). With ``patience``, a
        member whose ``monitor`` (minimised) has not improved for that many epochs stops.
        """
        active = self.active
        first_step, started = self.step, time.perf_counter()
        sums, counts, losses, terms = self._train_pass(active)
        elapsed = time.perf_counter() - started  # logging point: per-member syncs from here on
        self._sync_trainers()
        results: dict[int, dict[str, float]] = {}
        for k, member in enumerate(active):
            trainer = member.trainer
            step_losses = torch.stack(losses[k])
            finite = torch.isfinite(step_losses)
            if not bool(finite.all()):
                bad = int((~finite).nonzero()[0])
                detail = ", ".join(f"{key}={float(v):.6g}" for key, v in terms[k][bad].items())
                self._fail(member, f"TrialDiverged: loss became {float(step_losses[bad])} at step "
                           f"{first_step + bad} (epoch {trainer.epoch + 1}); terms: {detail}")
                continue
            member.step_losses.extend(step_losses.tolist())
            count = max(1, int(counts[k]))
            train = {f"train/{key}": float(v) / count for key, v in sums[k].items()}
            train.update({f"train/{key}": v for key, v in trainer._kappa_metrics["train"].items()})
            train["perf/epoch_seconds"] = elapsed
            train["perf/tokens_per_second"] = int(trainer.train_data.split.mask.sum()) / elapsed
            train["perf/cohort_size"] = float(len(active))
            trainer.train_epoch = lambda metrics=train: metrics  # the lone run_epoch, minus its pass
            try:
                with _own_rng(member):
                    results[member.position] = trainer.run_epoch()
            except TrialCheckFailed as error:
                self._fail(member, f"{type(error).__name__}: {error}")
                continue
            finally:
                del trainer.train_epoch
            self._after_epoch(member, results[member.position], patience, monitor)
        if len(self.active) != len(active):
            self._stack()
        return results

    def _fail(self, member: Member, reason: str) -> None:
        member.status, member.error = "failed", reason

    @staticmethod
    def _after_epoch(member: Member, metrics: dict[str, float], patience: int | None, monitor: str) -> None:
        value = metrics.get(monitor, math.nan)
        if value < member.best:
            member.best, member.since_best = value, 0
        else:
            member.since_best += 1
        if member.trainer.epoch >= member.config.training.epochs:
            member.status = "finished"
        elif patience is not None and member.since_best >= patience:
            member.status = "stopped"

    def stop(self, member: Member, reason: str = "stopped") -> None:
        """Take a running member out (e.g. a scheduler's decision); the others go on."""
        if member.status == "running":
            member.status, member.error = "stopped", reason
            self._stack()

    def run(self, on_epoch: MemberCallback | None = None, patience: int | None = None,
            monitor: str = "val/loss") -> list[Member]:
        """Train until every member finished, failed or stopped; returns the members.

        ``on_epoch(member, epoch, metrics)`` runs after each member's epoch (report, checkpoint);
        a truthy return stops that member.
        """
        while self.active:
            for position, metrics in self.run_epoch(patience, monitor).items():
                member = self.members[position]
                if on_epoch is not None and on_epoch(member, member.trainer.epoch, metrics):
                    self.stop(member, "stopped by on_epoch")
        return self.members

    def save_checkpoint(self, member: Member, path: Path | str) -> Path:
        """The member's lone-trainer checkpoint (a lone Trainer or a cohort can resume from it)."""
        with _own_rng(member):
            return member.trainer.save_checkpoint(path)


def run_cohort(configs: Sequence[TrialConfig], cache_root: Path | str = ".ksweep", *,
               on_epoch: MemberCallback | None = None, patience: int | None = None,
               checkpoints: Mapping[int, Path | str] | None = None) -> list[Member]:
    """Train ``configs`` as one cohort; per member: ``trainer`` (history, checkpoints), ``status``, ``error``."""
    return Cohort.create(configs, cache_root, checkpoints).run(on_epoch=on_epoch, patience=patience)
