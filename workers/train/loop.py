"""The training recipe: one trial's loop, evaluation, divergence handling and checkpoints.

Components (data, base model, CVAE, loss stack) are built from the TrialConfig; the
loop only composes them. The hot path has no host sync: per-step losses stay on
the device and are read once per epoch, the logging point.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from objectives import KappaSummaryAccumulator, LossInputs, LossStackSpec, baseline_self_check
from workers import metrics as latent_metrics
from workers.base import BaseSurprisal, load_or_train_base
from workers.data import SyntheticSplit, generate_task
from workers.models import CVAE, CVAEOutput
from workers.models.backbone import upcast
from workers.train.config import TrialConfig

RECON_TERMS = {
    "recon_uniform": "uniform",
    "recon_token_weighted": "token_weighted",
    "recon_ncc": "normalized_concentration_corrected",
}
KAPPA_METRICS = ("kappa_mean", "kappa_p50", "kappa_p90", "kappa_max", "cv2_mean")


class TrialDiverged(RuntimeError):
    """The loss became NaN or infinite; the message names the step and the terms."""


class TrialCheckFailed(RuntimeError):
    """The baseline self-check of OBJECTIVE.md failed."""


def resolve_device(name: str) -> torch.device:
    """'auto' -> cuda when available, else cpu; 'cuda' without CUDA raises ValueError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("training.device is 'cuda' but CUDA is not available; use 'auto' or 'cpu'")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


EpochCallback = Callable[["Trainer", int, dict[str, float]], None]


@dataclass
class _SplitTensors:
    split: SyntheticSplit
    decoder_input: torch.Tensor
    base_nll: torch.Tensor


@dataclass
class Trainer:
    """One trial. Build with :meth:`create`, then :meth:`run` (or step epochs yourself)."""

    config: TrialConfig
    device: torch.device
    base: BaseSurprisal
    model: CVAE
    optimizer: torch.optim.Optimizer
    train_data: _SplitTensors
    val_data: _SplitTensors
    epoch: int = 0  # completed epochs
    step: int = 0  # optimisation steps taken
    history: dict[str, list[float]] = field(default_factory=dict)
    kappa_values: dict[str, np.ndarray] = field(default_factory=dict)
    _kappa_metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    _generator: torch.Generator | None = None

    @classmethod
    def create(cls, config: TrialConfig, cache_root: Path | str = ".ksweep") -> Trainer:
        """Generate the data, get b_t (oracle or cached learned base) and build the model."""
        device = resolve_device(config.training.device)
        if config.training.num_threads:
            torch.set_num_threads(config.training.num_threads)
        seed_everything(config.seed)
        train, val = generate_task(config.data)
        base = load_or_train_base(config.data, config.base, cache_root, device, (train, val))
        seed_everything(config.seed)  # the base model's training must not shift the trial's RNG
        model = CVAE(config.model, config.data.vocab_size, config.data.num_strategies).to(device)
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=config.training.learning_rate,
            weight_decay=config.training.weight_decay,
        )

        def tensors(split: SyntheticSplit, nll: torch.Tensor) -> _SplitTensors:
            split = split.to(device)
            return _SplitTensors(split, split.decoder_input(), nll.to(device))

        trainer = cls(config, device, base, model, optimizer,
                      tensors(train, base.train_nll), tensors(val, base.val_nll))
        trainer._generator = torch.Generator().manual_seed(config.seed)
        trainer._summarise_kappa()
        return trainer

    # -- objectives -------------------------------------------------------------------------

    @property
    def c_base(self) -> float:
        return self.base.c_base

    def _stacks(self):
        stack = self.config.loss_stack.build(c_base=self.c_base)
        diagnostics = LossStackSpec(
            alpha=self.config.alpha, terms={term: 0.0 for term in RECON_TERMS.values()}
        ).build(c_base=self.c_base)
        return stack, diagnostics

    def _summarise_kappa(self) -> None:
        """kappa depends on b and alpha only: summarise each split once, log it every epoch."""
        for name, data in (("train", self.train_data), ("val", self.val_data)):
            accumulator = KappaSummaryAccumulator(self.config.alpha)
            accumulator.update(data.base_nll, data.split.mask)
            summary = accumulator.compute()
            self._kappa_metrics[name] = {key: float(summary[key]) for key in KAPPA_METRICS}
            self.kappa_values[name] = accumulator.kappa_values().numpy()

    def _forward(self, data: _SplitTensors, indices: torch.Tensor) -> tuple[CVAEOutput, LossInputs]:
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
            targets=split.target[indices], step=self.step,
        )
        return output, inputs

    @staticmethod
    def _batch_values(stack_out, diag_out, output: CVAEOutput, mask: torch.Tensor):
        """Per-batch metric tensors (on device) and the batch's count of active examples."""
        active = mask.any(dim=-1)
        kl = upcast(output.kl)
        kl_per_example = kl.sum(dim=-1) if kl.dim() == 2 else kl
        count = active.sum()
        values = {
            "loss": stack_out.total.detach(),
            "kl": torch.where(active, kl_per_example.detach(), 0.0).sum() / count.clamp_min(1),
        }
        for metric, term in RECON_TERMS.items():
            values[metric] = diag_out.terms[term].detach()
        return values, count

    # -- one epoch --------------------------------------------------------------------------

    def train_epoch(self) -> dict[str, float]:
        """One pass over the train split; returns the epoch's train metrics (a logging point)."""
        self.model.train()
        stack, diagnostics = self._stacks()
        data, clip = self.train_data, self.config.training.grad_clip
        inject = self.config.training.inject_nan_at_step
        sums: dict[str, torch.Tensor] = {}
        total_count = torch.zeros((), dtype=torch.long, device=self.device)
        step_losses: list[torch.Tensor] = []
        step_terms: list[dict[str, torch.Tensor]] = []
        first_step = self.step
        tokens = 0
        started = time.perf_counter()
        permutation = torch.randperm(len(data.split), generator=self._generator)
        for indices in permutation.split(self.config.training.batch_size):
            indices = indices.to(self.device)
            self.model.step = self.step
            output, inputs = self._forward(data, indices)
            stack_out = stack(inputs)
            loss = stack_out.total
            if inject is not None and self.step == inject:
                loss = loss * float("nan")
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
            self.optimizer.step()
            with torch.no_grad():
                diag_out = diagnostics(LossInputs(inputs.token_nll.detach(), inputs.base_nll, inputs.mask))
                values, count = self._batch_values(stack_out, diag_out, output, inputs.mask)
                values["loss"] = loss.detach()
                for key, value in values.items():
                    sums[key] = sums.get(key, 0.0) + value * count
                total_count = total_count + count
            step_losses.append(loss.detach())
            step_terms.append({k: v.detach() for k, v in stack_out.terms.items()})
            tokens += int(indices.numel()) * data.split.mask.shape[1]
            self.step += 1
        # Logging point: one host sync for the whole epoch.
        losses = torch.stack(step_losses)
        finite = torch.isfinite(losses)
        if not bool(finite.all()):
            bad = int((~finite).nonzero()[0])
            terms = ", ".join(f"{k}={float(v):.6g}" for k, v in step_terms[bad].items())
            raise TrialDiverged(
                f"loss became {float(losses[bad])} at step {first_step + bad} "
                f"(epoch {self.epoch + 1}); terms: {terms}"
            )
        elapsed = time.perf_counter() - started
        count = max(1, int(total_count))
        result = {f"train/{k}": float(v) / count for k, v in sums.items()}
        result.update({f"train/{k}": v for k, v in self._kappa_metrics["train"].items()})
        active_tokens = int(data.split.mask.sum())
        result["perf/epoch_seconds"] = elapsed
        result["perf/tokens_per_second"] = active_tokens / elapsed if elapsed > 0 else math.inf
        return result

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Val metrics: the losses, kappa summary, latent recovery and the baseline self-check."""
        self.model.eval()
        stack, diagnostics = self._stacks()
        data = self.val_data
        sums: dict[str, torch.Tensor] = {}
        total_count = torch.zeros((), dtype=torch.long, device=self.device)
        probs, means, logvars = [], [], []
        for indices in torch.arange(len(data.split)).split(self.config.training.eval_batch_size):
            indices = indices.to(self.device)
            output, inputs = self._forward(data, indices)
            values, count = self._batch_values(
                stack(inputs), diagnostics(LossInputs(inputs.token_nll, inputs.base_nll, inputs.mask)),
                output, inputs.mask,
            )
            for key, value in values.items():
                sums[key] = sums.get(key, 0.0) + value * count
            total_count = total_count + count
            if output.posterior_probs is not None:
                probs.append(output.posterior_probs.float().cpu())
            if output.posterior_mean is not None:
                means.append(output.posterior_mean.float().cpu())
                logvars.append(output.posterior_logvar.float().cpu())
        count = max(1, int(total_count))
        result = {f"val/{k}": float(v) / count for k, v in sums.items()}
        result.update({f"val/{k}": v for k, v in self._kappa_metrics["val"].items()})
        truth = data.split.strategy.cpu()
        k = self.config.data.num_strategies
        if probs:
            posterior = torch.cat(probs)
            inferred = posterior.argmax(dim=-1)
            result["val/mutual_info"] = latent_metrics.discrete_mutual_information(posterior)
            result["val/active_units"] = float(latent_metrics.active_units_discrete(posterior))
        else:
            mean, logvar = torch.cat(means), torch.cat(logvars)
            inferred = latent_metrics.kmeans_labels(mean, k, seed=self.config.seed)
            result["val/mutual_info"] = latent_metrics.gaussian_mutual_information(
                mean, logvar, seed=self.config.seed
            )
            result["val/active_units"] = float(latent_metrics.active_units_gaussian(mean))
        recovery = latent_metrics.latent_recovery(inferred, truth)
        result["val/latent_nmi"] = recovery["latent_nmi"]
        result["val/latent_ari"] = recovery["latent_ari"]
        check = baseline_self_check(data.base_nll, data.split.mask, self.config.alpha)
        result["val/baseline_self_check"] = check.deviation
        if not check.passed:
            raise TrialCheckFailed(check.reason)
        return result

    def run_epoch(self) -> dict[str, float]:
        """Train one epoch, evaluate, record the history; returns the epoch's metrics."""
        metrics = self.train_epoch()
        metrics.update(self.evaluate())
        self.epoch += 1
        metrics["epoch"] = float(self.epoch)
        for key, value in metrics.items():
            self.history.setdefault(key, []).append(value)
        return metrics

    def run(self, on_epoch: EpochCallback | None = None) -> dict[str, float]:
        """Train to ``training.epochs`` (from the current epoch); returns the last metrics."""
        metrics: dict[str, float] = {}
        while self.epoch < self.config.training.epochs:
            metrics = self.run_epoch()
            if on_epoch is not None:
                on_epoch(self, self.epoch, metrics)
        return metrics

    # -- checkpoints ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Model, optimiser, counters, history and every RNG state (to resume mid-trial)."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "epoch": self.epoch,
            "step": self.step,
            "history": self.history,
            "config": self.config.model_dump(mode="json"),
            "rng": {
                "python": random.getstate(),
                "numpy": np.random.get_state(),
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
                "batching": self._generator.get_state() if self._generator else None,
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state written by :meth:`state_dict` (the config must match)."""
        if state["config"] != self.config.model_dump(mode="json"):
            raise ValueError("checkpoint was written by a different trial config; refusing to resume")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.epoch, self.step, self.history = state["epoch"], state["step"], state["history"]
        rng = state["rng"]
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        torch.set_rng_state(rng["torch"])
        if rng["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        if rng["batching"] is not None and self._generator is not None:
            self._generator.set_state(rng["batching"])

    def save_checkpoint(self, path: Path | str) -> Path:
        """Write the state atomically to ``path`` (a file)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(path.name + ".tmp")
        torch.save(self.state_dict(), staging)
        staging.replace(path)
        return path

    def load_checkpoint(self, path: Path | str) -> None:
        """Resume from a file written by :meth:`save_checkpoint`."""
        self.load_state_dict(torch.load(path, map_location=self.device, weights_only=False))
