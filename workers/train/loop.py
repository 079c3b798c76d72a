"""The training recipe: one trial's loop, evaluation and divergence handling (checkpoints: state.py).

Components (data, base model, CVAE, loss stack) are built from the TrialConfig and the loop
composes them. The hot path has no host sync: per-step losses stay on the device and are read
once per epoch, the logging point.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from objectives import KappaSummaryAccumulator, LossInputs, LossStackSpec, baseline_self_check
from objectives.rate_control import RateControl
from workers.adamw import AdamW
from workers.contract import (
    PERF_EPOCH_SECONDS,
    PERF_TOKENS_PER_SECOND,
    TRAIN_KL,
    VAL_BASELINE_SELF_CHECK,
    VAL_KL,
    selected_name,
)
from workers.models import CVAE, CVAEOutput
from workers.models.backbone import upcast
from workers.readouts.evaluate import (
    Collected,
    collect,
    diagnostic_stack,
    model_readouts,
    position_profiles,
)
from workers.readouts.gradients import (
    gradient_shares,
    posterior_parameters,
    reconstruction_spec,
    token_groups,
)
from workers.readouts.split_data import SplitData, readout_split
from workers.train import phases
from workers.train.batch_metrics import batch_metrics, divergence, kl_multiplier_metrics
from workers.train.config import TrialConfig
from workers.train.selection import Selection, selected_metrics, speed_metrics, trial_selection
from workers.train.sources import TaskView, load_sources
from workers.train.state import (
    load_trainer_state,
    resolve_device,
    save_state,
    seed_everything,
    trainer_state,
)
from workers.zfree.base import BaseSurprisal

KAPPA_METRICS = ("kappa_mean", "kappa_p50", "kappa_p90", "kappa_max", "cv2_mean")


class TrialDiverged(RuntimeError):
    """The loss became NaN or infinite; the message names the step and the terms."""


class TrialCheckFailed(RuntimeError):
    """The baseline self-check (docs/concepts/objectives.md, the R^ section) failed."""


EpochCallback = Callable[["Trainer", int, dict[str, float]], None]


@dataclass
class Trainer:
    """One trial. Build with :meth:`create`, then :meth:`run` (or step epochs yourself)."""

    config: TrialConfig
    device: torch.device
    base: BaseSurprisal
    model: CVAE
    optimizer: AdamW
    train_data: SplitData
    val_data: SplitData
    test_data: SplitData
    selection: Selection
    view: TaskView
    data_hashes: dict[str, str] = field(default_factory=dict)
    epoch: int = 0  # completed epochs
    step: int = 0  # optimisation steps taken
    history: dict[str, list[float]] = field(default_factory=dict)
    kappa_values: dict[str, np.ndarray] = field(default_factory=dict)
    final_metrics: dict[str, float] = field(default_factory=dict)
    profiles: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    rate_control: RateControl | None = None  # the KL's multiplier under kl target_rate (checkpointed)
    _kappa_metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    _train_kappa_means: dict[float, float] = field(default_factory=dict)  # alpha -> train mean kappa
    _generator: torch.Generator | None = None

    @classmethod
    def create(cls, config: TrialConfig, cache_root: Path | str = ".ksweep") -> Trainer:
        """Generate the data, get b_t (oracle or cached learned base) and build the model."""
        device = resolve_device(config.training.device)
        if config.training.num_threads:
            torch.set_num_threads(config.training.num_threads)
        seed_everything(config.seed)
        view, data, base = load_sources(config, cache_root, device)
        seed_everything(config.seed)  # the base model's training must not shift the trial's RNG
        model = CVAE(config.model, view.vocab_size, view.num_strategies,
                     config.total_steps(len(data["train"].split))).to(device)
        optimizer = AdamW(model.parameters(), lr=config.training.learning_rate,
                          weight_decay=config.training.weight_decay)
        trainer = cls(config, device, base, model, optimizer, data["train"], data["val"],
                      data["test"], trial_selection(config.training), view, view.data_hashes)
        trainer._generator = torch.Generator().manual_seed(config.seed)
        trainer.rate_control = trainer.build_stack(config.loss_stack).rate_control(device)
        trainer.selection.rate_target = None if trainer.rate_control is None else trainer.rate_control.target
        trainer._summarise_kappa()
        return trainer

    # -- objectives -------------------------------------------------------------------------

    @property
    def c_base(self) -> float:
        return self.base.c_base

    @property
    def total_steps(self) -> int:
        """The run's optimizer steps: epochs x ceil(train rows / batch_size) (one per batch)."""
        return self.config.total_steps(len(self.train_data.split))

    def build_stack(self, spec: LossStackSpec):
        """``spec`` built with this trial's reference scales (c_base, the train split's mean
        kappa) and its run's optimizer steps."""
        return spec.build(c_base=self.c_base, train_kappa=self.train_kappa(spec),
                          total_steps=self.total_steps)

    def train_kappa(self, spec: LossStackSpec) -> dict[float, float]:
        """The train split's mean kappa at each alpha of ``spec``'s terms (only if a term needs it)."""
        if not spec.needs_train_kappa:
            return {}
        for alpha in spec.term_alphas() - self._train_kappa_means.keys():
            accumulator = KappaSummaryAccumulator(alpha)
            accumulator.update(self.train_data.base_nll, self.train_data.split.mask)
            self._train_kappa_means[alpha] = float(accumulator.compute()["kappa_mean"])
        return {alpha: self._train_kappa_means[alpha] for alpha in sorted(spec.term_alphas())}

    def loss_stacks(self):
        """The trial's loss stack and its diagnostic stack, as its training pass builds them (a
        cohort's builds each member's from here)."""
        return self.build_stack(self.config.loss_stack), diagnostic_stack(self.config.alpha, self.c_base)

    @property
    def batch_generator(self) -> torch.Generator | None:
        """The stream the training batches' order is drawn from (a checkpoint keeps its state)."""
        return self._generator

    @property
    def kappa_metrics(self) -> dict[str, dict[str, float]]:
        """Each split's kappa summaries at the trial's alpha (``{split: {name: value}}``)."""
        return self._kappa_metrics

    @property
    def splits(self) -> dict[str, SplitData]:
        """The three splits with their read-out tensors."""
        return {"train": self.train_data, "val": self.val_data, "test": self.test_data}

    def _summarise_kappa(self) -> None:
        """kappa depends on b and alpha only: summarise each split once, log it every epoch."""
        for name, data in self.splits.items():
            accumulator = KappaSummaryAccumulator(self.config.alpha)
            accumulator.update(data.base_nll, data.split.mask)
            summary = accumulator.compute()
            self._kappa_metrics[name] = {key: float(summary[key]) for key in KAPPA_METRICS}
            self.kappa_values[name] = accumulator.kappa_values().numpy()

    def _forward(self, data: SplitData, indices: torch.Tensor) -> tuple[CVAEOutput, LossInputs]:
        split = data.split
        autocast = (
            torch.autocast("cuda", dtype=torch.bfloat16)
            if self.config.training.bf16 and self.device.type == "cuda"
            else contextlib.nullcontext()
        )
        with autocast:
            output = self.model(
                split.context[indices], data.decoder_input[indices], split.target[indices],
                split.mask[indices],
            )
        inputs = LossInputs(
            token_nll=upcast(output.token_nll), base_nll=data.base_nll[indices],
            mask=split.mask[indices], kl=upcast(output.kl), bow_logits=output.bow_logits,
            targets=split.target[indices], posterior_probs=output.posterior_probs, step=self.step,
        )
        return output, inputs

    # -- one epoch --------------------------------------------------------------------------

    def train_epoch(self) -> dict[str, float]:
        """One pass over the train split; returns the epoch's train metrics (a logging point)."""
        self.model.train()
        stack, diagnostics = self.loss_stacks()
        data, clip, training = self.train_data, self.config.training.grad_clip, self.config.training
        stack = phases.training_stack(stack, training, len(data.split))  # KL off in pre-training
        inject = training.inject_nan_at_step
        parts = phases.start_epoch(self, self.epoch)  # the parameters of each part; resets the decoder
        sums: dict[str, torch.Tensor] = {}
        total_count = torch.zeros((), dtype=torch.long, device=self.device)
        step_losses: list[torch.Tensor] = []
        step_terms: list[dict[str, torch.Tensor]] = []
        first_step = self.step
        control = self.rate_control  # the weights' schedule: when the KL is on, its weight when not controlled
        schedule = phases.training_stack(self.build_stack(self.config.loss_stack), training, len(data.split))
        started = time.perf_counter()
        batches = torch.randperm(len(data.split), generator=self._generator).split(training.batch_size)
        for index, part in phases.update_plan(len(batches), training, self.epoch):
            indices = batches[index].to(self.device)
            self.model.step = self.step
            output, inputs = self._forward(data, indices)
            inputs.kl_weight = None if control is None else control.beta
            stack_out = stack(inputs)
            loss = stack_out.total
            if inject is not None and self.step == inject and phases.counted(part):
                loss = loss * float("nan")
            self.optimizer.zero_grad()
            loss.backward(inputs=parts.get(part))  # None: every parameter
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
            self.optimizer.step()
            if not phases.counted(part):
                continue
            with torch.no_grad():
                diag_out = diagnostics(LossInputs(inputs.token_nll.detach(), inputs.base_nll, inputs.mask))
                values, count = batch_metrics(stack_out, diag_out, output, inputs.mask)
                values["loss"] = loss.detach()
                if control is not None and schedule.kl_on(self.step):
                    control.update(values["kl"])  # on the device: read at the epoch's end
                for key, value in values.items():
                    sums[key] = sums.get(key, 0.0) + value * count
                total_count = total_count + count
            step_losses.append(loss.detach())
            step_terms.append({k: v.detach() for k, v in stack_out.terms.items()})
            self.step += 1
        # Logging point: one host sync for the whole epoch.
        terms = {key: torch.stack([t[key] for t in step_terms]) for key in (step_terms or [{}])[0]}
        diverged = divergence(torch.stack(step_losses), terms, first_step, self.epoch)
        if diverged is not None:
            raise TrialDiverged(diverged)
        elapsed = time.perf_counter() - started
        count = max(1, int(total_count))
        result = {f"train/{k}": float(v) / count for k, v in sums.items()}
        result.update({f"train/{k}": v for k, v in self._kappa_metrics["train"].items()})
        result.update(kl_multiplier_metrics(self.rate_control, schedule, self.step))
        active_tokens = int(data.split.mask.sum())
        result[PERF_EPOCH_SECONDS] = elapsed
        result[PERF_TOKENS_PER_SECOND] = active_tokens / elapsed if elapsed > 0 else math.inf
        return result

    def evaluate_split(self, name: str, collected: Collected | None = None) -> dict[str, float]:
        """Read-outs of one split at the current model, prefixed ``{name}/`` (no train step);
        ``collected``: the model's outputs on the split when the caller ran them (a cohort)."""
        self.model.eval()
        stack, diagnostics = self.loss_stacks()
        data = self.splits[name]
        data = readout_split(data, name, self.config.readouts.train_subset)
        if collected is None:
            collected = collect(lambda idx: self._forward(data, idx)[0], len(data.split),
                                self.config.training.eval_batch_size, self.device)
        values = model_readouts(collected, data, stack, diagnostics, step=self.step,
                                num_strategies=self.view.num_strategies,
                                seed=self.config.seed, alpha=self.config.alpha)
        values.update(self.splits[name].surprisal)  # b/h read-outs on the whole split
        values["c_base"] = self.c_base
        out = {f"{name}/{key}": value for key, value in values.items()}
        out.update({f"{name}/{k}": v for k, v in self._kappa_metrics[name].items()})
        return out

    def gradient_batch(self) -> tuple[SplitData, dict[str, torch.Tensor], LossStackSpec] | None:
        """The gradient shares' fixed batch (the first ``readouts.gradient_batch`` val examples),
        its token groups and the stack's reconstruction part; None when the read-out is off or
        the stack has no term linear in l_t."""
        size = min(self.config.readouts.gradient_batch, len(self.val_data.split))
        recon = reconstruction_spec(self.config.loss_stack)
        if size == 0 or recon is None:
            return None
        data = self.val_data.subset(torch.arange(size))
        groups = token_groups(data.base_nll, data.cond_nll, data.split.mask, data.split.kind,
                              data.prefix_length, self.view.kinds)
        return data, groups, recon

    def gradient_readouts(self) -> dict[str, float]:
        """Gradient shares of the token groups on the fixed val batch (readouts.gradients)."""
        batch = self.gradient_batch()
        if batch is None:
            return {}
        data, groups, recon = batch
        self.model.eval()
        params = posterior_parameters(self.model)
        # cuDNN's RNN backward refuses eval mode; the native kernels do not (CPU: no effect).
        with torch.backends.cudnn.flags(enabled=False):
            shares = gradient_shares(
                lambda: self._forward(data, torch.arange(len(data.split), device=self.device))[0].token_nll,
                params, self.build_stack(recon), data.base_nll, data.split.mask, groups,
            )
        return {f"val/{key}": value for key, value in shares.items()}

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Epoch-end read-outs of train (fixed random subset), val and test, and the baseline self-check.

        Nothing that selects reads a ``test/`` value; the evaluation consumes no RNG state.
        """
        names = self.config.readouts.epoch_splits()
        result: dict[str, float] = {}
        for name in names:
            result.update(self.evaluate_split(name))
        result.update(self.gradient_readouts())
        data = self.val_data
        check = baseline_self_check(data.base_nll, data.split.mask, self.config.alpha)
        result[VAL_BASELINE_SELF_CHECK] = check.deviation
        if not check.passed:
            raise TrialCheckFailed(check.reason)
        return result

    def run_epoch(self) -> dict[str, float]:
        """Train one epoch, evaluate, record the history and the selection; returns the metrics."""
        running = self.train_epoch()
        metrics = self.evaluate()
        if self.rate_control is not None:  # the held-out rate corrects the train target
            self.rate_control.correct(metrics.get(VAL_KL, math.nan), running.get(TRAIN_KL, math.nan))
        metrics.update(running)  # overall train losses: the running means of the steps
        self.epoch += 1
        metrics["epoch"] = float(self.epoch)
        for key, value in metrics.items():
            self.history.setdefault(key, []).append(value)
        self.selection.update(self.epoch, metrics, self.model)
        return metrics

    @property
    def finished(self) -> bool:
        """True once the epoch budget is spent or early stopping ended the run."""
        return self.epoch >= self.config.training.epochs or self.selection.stopped

    def finalize(self) -> dict[str, float]:
        """Restore the checkpoint val chose and read the end-of-run values (idempotent).

        Returns ``selected/{split}/{name}`` (every per-split metric at the selected epoch),
        ``selected/epoch``, ``training/stop_epoch`` and the speed read-outs
        (``{val,test}[/{kind}]/nmi_auc``, ``epochs_to_nmi90``, ``..._censored``); also kept
        in ``final_metrics``. The per-position profiles of val go to ``profiles``.
        """
        if self.selection.best_model is not None:
            self.model.load_state_dict(self.selection.best_model)
        horizon = self.config.readouts.nmi_auc_horizon or self.config.training.epochs
        final = selected_metrics(self.history, self.selection.best_epoch)
        final.update(speed_metrics(self.history, horizon, self.epoch, self.view.kinds))
        readouts = self.config.readouts
        if self.epoch > 0 and readouts.test and not readouts.test_every_epoch:
            with torch.no_grad():  # test read once, at the checkpoint val chose
                final.update({selected_name(key): value for key, value in self.evaluate_split("test").items()})
        if self.epoch > 0:
            self.model.eval()
            data = self.val_data
            with torch.no_grad():
                collected = collect(lambda idx: self._forward(data, idx)[0], len(data.split),
                                    self.config.training.eval_batch_size, self.device)
            self.profiles = position_profiles(collected, data, self.config.alpha)
        self.final_metrics = final
        return final

    def run(self, on_epoch: EpochCallback | None = None) -> dict[str, float]:
        """Train until :attr:`finished` (from the current epoch), then :meth:`finalize`;
        returns the last epoch's metrics."""
        metrics: dict[str, float] = {}
        while not self.finished:
            metrics = self.run_epoch()
            if on_epoch is not None:
                on_epoch(self, self.epoch, metrics)
        self.finalize()
        return metrics

    # -- checkpoints ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Model, optimiser, counters, history and every RNG state (to resume mid-trial)."""
        return trainer_state(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state written by :meth:`state_dict` (the config must match)."""
        load_trainer_state(self, state)

    def save_checkpoint(self, path: Path | str) -> Path:
        """Write the state atomically to ``path`` (a file)."""
        return save_state(self.state_dict(), path)

    def load_checkpoint(self, path: Path | str) -> None:
        """Resume from a file written by :meth:`save_checkpoint`."""
        self.load_state_dict(torch.load(path, map_location=self.device, weights_only=False))
