"""A cohort's training step under ``torch.compile``, on static shapes so it compiles once.

The eager pass re-stacks the members whenever one leaves and feeds the last, short batch at
its own size: each a new shape, and a new compile. Here every batch has ``batch_size`` rows,
the target side is cut to one of a few length buckets, a member that leaves stays stacked but
masked, and schedules are tensors (:class:`CompiledStep`). So after one warm-up step per
bucket nothing recompiles, and member k's numbers are the eager cohort's up to float rounding
(tests/workers/test_cohort_compiled.py).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import time
from pathlib import Path

import torch

from objectives import LossInputs
from workers.cohort import phases
from workers.cohort.losses import loss_groups
from workers.cohort.member import POSTERIOR_PROBS, per_member
from workers.cohort.optim import clip_per_member
from workers.cohort.phases import Draws, member_draws
from workers.contract import PERF_COMPILE_SECONDS, TrainingStatus
from workers.models import CVAEOutput
from workers.models.backbone import upcast
from workers.models.functional import cvae_forward
from workers.settings import worker_settings
from workers.train import phases as train_phases
from workers.train.batch_metrics import batch_metrics

log = logging.getLogger(__name__)

TARGET_SIDE = ("target", "decoder_input", "mask", "base_nll")  # cut to a length bucket; context is not
BUCKETS = 4  # length buckets per split: a warm-up compile each
# Device types where the compiled step measured faster than eager ('auto' compiles there).
# CPU: steps 0.6-0.7x eager's, but the compile outweighs a sweep cohort's steps
# (docs/performance-cohorts.md); CUDA: not measured yet, so eager until it is.
MEASURED_FASTER: frozenset[str] = frozenset()


def length_buckets(length: int, count: int = BUCKETS) -> list[int]:
    """``count`` evenly spaced lengths up to ``length`` (fewer when ``length`` is short), ascending."""
    return sorted({max(1, math.ceil(length * (i + 1) / count)) for i in range(count)})


def inductor_cache_dir(cache_root: Path | str) -> Path:
    """Where inductor keeps its compiled kernels: ``$KSWEEP_SWEEP_ROOT/inductor``, else under the cache root."""
    return Path(worker_settings().sweep_root or cache_root) / "inductor"


def use_inductor_cache(cache_root: Path | str) -> str:
    """Point ``TORCHINDUCTOR_CACHE_DIR`` at :func:`inductor_cache_dir` unless someone chose another
    directory; returns the directory in use. Inductor writes its default into the variable the
    first time it looks, so the default counts as not chosen."""
    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
        default = default_cache_dir()
    except ImportError:  # a torch without this helper: only an unset variable counts as not chosen
        default = None
    if current is None or current == default:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(inductor_cache_dir(cache_root))
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]


def compile_problem(device: torch.device, backend: str) -> str | None:
    """Why ``backend`` cannot compile on ``device`` (None: it can, as far as can be told up front)."""
    if backend != "inductor":
        return None
    if device.type == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError as error:
            return f"inductor on CUDA needs triton ({error})"
        return None
    if device.type != "cpu":
        return f"inductor is not used on device type {device.type!r}"
    if not any(shutil.which(name) for name in (os.environ.get("CXX", ""), "g++", "clang++", "c++") if name):
        return "inductor on the CPU needs a C++ compiler (none of $CXX, g++, clang++, c++ is on PATH)"
    return None


def wants_compile(mode: str, device: torch.device) -> bool:
    """The ``training.compile`` setting resolved on ``device`` ('auto': only where it measured faster)."""
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"training.compile must be 'auto', 'on' or 'off', got {mode!r}")
    return mode == "on" or (mode == "auto" and device.type in MEASURED_FASTER)


class CompiledStep:
    """The compiled train pass of one cohort, on static shapes:

    - the last batch is padded to ``batch_size`` with rows whose mask is all False (every loss
      term and batch metric averages over rows with an active token, so they count for nothing)
      and whose noise is zero;
    - the target side (target, decoder input, mask, b_t) is cut to the smallest fixed length
      bucket that holds every running member's active tokens of the batch (the GRUs are causal
      and the target encoder reads the last active position); the context is never cut;
    - a member that stops or fails stays stacked but masked (``alive``): its loss is left out of
      the backward and the optimizer does not touch its slice, so the member axis never changes;
    - annealed term weights, the Gumbel temperature and the NaN injection are tensors, not
      Python numbers baked into the graph.

    Compiled are the forward and the objective stack (one graph; AOTAutograd compiles its
    backward) and the clipping plus stacked AdamW update (a second graph); aggressive
    inference-network updates (workers/train/phases.py) compile the update once more for each
    part they move.

    Build with :meth:`create` (None: eager). ``compile_seconds`` sums the warm-up steps
    (first step of each length bucket, compile included); ``fallback`` is the reason it went
    eager, once it did (logged at WARNING).
    """

    backend = "inductor"

    def __init__(self, cohort, backend: str) -> None:
        self.cohort, self.backend = cohort, backend
        self.rows = list(cohort.rows)
        self.compile_seconds = 0.0
        self.fallback: str | None = None
        self._warm: set[int] = set()
        data = cohort.train_tensors
        self._buckets = length_buckets(data["mask"].shape[-1])
        mask = data["mask"].cpu()  # per stored row: 1 + its last active position (0: none)
        positions = torch.arange(1, mask.shape[-1] + 1)
        self._row_length = torch.where(mask, positions, 0).amax(dim=-1)
        self._groups = self._build_groups()
        # A new cohort's closures fail the last one's guards: start dynamo's code cache afresh so
        # earlier cohorts of this process do not use up its recompile limit (the on-disk
        # inductor cache still serves their kernels).
        torch._dynamo.reset()
        for name, param in cohort.params.items():  # every state exists before the first compile
            cohort.optimizer.state_of(name, param)
        self._loss = torch.compile(self._loss_fn, backend=backend, dynamic=False)
        self._update = torch.compile(self._update_fn, backend=backend, dynamic=False)
        self._weights: dict[tuple, list[torch.Tensor]] = {}
        self._used: dict[tuple, dict[str, torch.Tensor]] = {}

    @classmethod
    def create(cls, cohort, mode: str, cache_root: Path | str, backend: str | None = None) -> CompiledStep | None:
        """The compiled step when ``mode`` asks for it on the cohort's device, else None (eager).

        Sets ``TORCHINDUCTOR_CACHE_DIR`` to :func:`inductor_cache_dir` (:func:`use_inductor_cache`).
        When compilation cannot run, logs the reason, stores it on ``cohort.compile_fallback``
        and returns None.
        """
        if not wants_compile(mode, cohort.device):
            return None
        backend = backend or cls.backend
        problem = compile_problem(cohort.device, backend)
        if problem is None and any(m.trainer.rate_control is not None for m in cohort.members):
            problem = "the kl target_rate control is not compiled (its multiplier is a per-step input)"
        if problem is not None:
            cohort.compile_fallback = f"{problem}; training eagerly"
            log.warning("cohort: %s", cohort.compile_fallback)
            return None
        use_inductor_cache(cache_root)
        return cls(cohort, backend)

    def metrics(self) -> dict[str, float]:
        """Added to every member's train metrics: the warm-up seconds so far (compile included)."""
        return {PERF_COMPILE_SECONDS: self.compile_seconds}

    # -- set-up -----------------------------------------------------------------------------

    def _build_groups(self) -> list[dict]:
        """Members with one loss stack share a vmapped loss; which outputs each term reaches."""
        groups = []
        for index, positions, _ in loss_groups(self.rows, self.cohort.train_tensors["target"].shape[1],
                                               self.cohort.device):
            stack, diagnostics = self.rows[positions[0]].trainer.loss_stacks()
            stack = train_phases.training_stack(stack, self.rows[0].config.training, self.cohort.train_tensors["target"].shape[1])

            def member_loss(token_nll, base_nll, mask, kl, bow_logits, targets, weights, posterior_probs,
                            stack=stack, diagnostics=diagnostics):
                """Member's weighted loss, unweighted terms and batch metrics (vmapped)."""
                out = stack(LossInputs(token_nll=token_nll, base_nll=base_nll, mask=mask, kl=kl,
                                       bow_logits=bow_logits, targets=targets,
                                       posterior_probs=posterior_probs, step=0))
                total = torch.zeros((), dtype=token_nll.dtype, device=token_nll.device)
                for i, value in enumerate(out.terms.values()):  # the eager stack's sum, in its order
                    total = total + torch.where(weights[i] != 0, weights[i] * value.to(total.dtype), 0.0)
                diag_out = diagnostics(LossInputs(token_nll.detach(), base_nll, mask))
                values, count = batch_metrics(out, diag_out, CVAEOutput(token_nll, kl, bow_logits), mask)
                return total, {k: v.detach() for k, v in out.terms.items()}, values, count

            groups.append({"index": index, "positions": positions, "stack": stack, "fn": member_loss,
                           "reaches": self._reaches(stack, positions[0])})
        return groups

    def _reaches(self, stack, row: int) -> dict[str, frozenset[str]]:
        """Per term of ``stack``: the model outputs its value has a gradient path to (one eager probe)."""
        cohort = self.cohort
        data = {k: v[cohort.train_source[row:row + 1], :2] for k, v in cohort.train_tensors.items()}
        params = {n: p[row:row + 1].detach() for n, p in cohort.params.items()}
        generator = torch.Generator(cohort.device).manual_seed(0)
        noise, dropped = member_draws(cohort, [generator], 2)
        with torch.no_grad():
            out = cvae_forward(params, cohort.model_config, cohort.num_categories, data["context"],
                               data["decoder_input"], data["target"], data["mask"], noise, 1.0,
                               dropped=dropped)
        outputs = cohort.outputs
        leaves = {key: upcast(out[key])[0].detach().requires_grad_() for key in outputs}
        terms = stack(LossInputs(token_nll=leaves["token_nll"], base_nll=data["base_nll"][0],
                                 mask=data["mask"][0], kl=leaves["kl"], bow_logits=leaves["bow_logits"],
                                 targets=data["target"][0], posterior_probs=leaves.get(POSTERIOR_PROBS))).terms
        reaches = {}
        for name, value in terms.items():
            grads = torch.autograd.grad(value, [leaves[k] for k in outputs], allow_unused=True, retain_graph=True)
            reaches[name] = frozenset(k for k, g in zip(outputs, grads, strict=True) if g is not None)
        return reaches

    # -- the compiled functions -------------------------------------------------------------

    def _loss_fn(self, params, context, decoder_input, target, mask, base_nll, draws, temperature,
                 weights, scale, alive):
        """Forward and objective stacks of all stacked members; the masked loss sum and per-group outputs."""
        cohort, (noise, dropped) = self.cohort, draws
        out = cvae_forward(params, cohort.model_config, cohort.num_categories, context, decoder_input,
                           target, mask, noise, temperature, dropped=dropped)
        outputs = {key: upcast(out[key]) for key in cohort.outputs}
        probs = outputs.get(POSTERIOR_PROBS)
        loss, per_group = None, []
        for group, group_weights in zip(self._groups, weights, strict=True):
            index = group["index"]
            total, terms, values, count = torch.func.vmap(
                group["fn"], in_dims=(0,) * 6 + (None, None if probs is None else 0))(
                outputs["token_nll"][index], base_nll[index], mask[index], outputs["kl"][index],
                outputs["bow_logits"][index], target[index], group_weights,
                None if probs is None else probs[index])
            total = total * scale[index]
            values["loss"] = total.detach()
            part = torch.where(alive[index], total, 0.0).sum()
            loss = part if loss is None else loss + part
            per_group.append((total.detach(), terms, values, count))
        return loss, per_group

    def _update_fn(self, grads, used):
        """Per-member clipping and the stacked AdamW step (in place)."""
        clip_per_member(grads, self.cohort.max_norm)
        self.cohort.optimizer.step(grads, used)

    # -- per step, on the host --------------------------------------------------------------

    def _step_weights(self, step: int, dtype: torch.dtype) -> list[torch.Tensor]:
        """Each group's term weights at ``step`` as a tensor (cached by value: no recompile)."""
        values = [tuple(g["stack"].weights_at(step).values()) for g in self._groups]
        key = (tuple(values), dtype)
        if key not in self._weights:
            device = self.cohort.device
            self._weights[key] = [torch.tensor(v, dtype=dtype, device=device) for v in values]
        return self._weights[key]

    def _step_used(self, weights: list[tuple], alive: tuple[bool, ...]) -> dict[str, torch.Tensor]:
        """Per parameter ``[K]``: member k is running and a term with a nonzero weight reached it."""
        key = (tuple(weights), alive)
        if key not in self._used:
            reached = {o: [False] * len(self.rows) for o in self.cohort.outputs}
            for group, values in zip(self._groups, weights, strict=True):
                hit = set().union(*(group["reaches"][n] for n, w in zip(group["reaches"], values, strict=True) if w))
                for k in group["positions"]:
                    for o in hit:
                        reached[o][k] = bool(alive[k])
            self._used[key] = self.cohort._used(reached)
        return self._used[key]

    def _bucket(self, rows: torch.Tensor, indices: torch.Tensor) -> int:
        """The smallest length bucket holding every running member's active tokens of the batch."""
        source = self.cohort.train_source.cpu()[rows]
        longest = int(self._row_length[source.unsqueeze(1), indices[rows]].max()) if len(rows) else 1
        return next(b for b in self._buckets if b >= longest)

    def _call(self, compiled, eager, *args):
        """``compiled(*args)``; on a compile error, log it once and go on eagerly."""
        if self.fallback is None:
            try:
                return compiled(*args)
            except Exception as error:  # noqa: BLE001 - any compiler failure: eager, with the reason
                self.fallback = f"torch.compile failed ({type(error).__name__}: {str(error)[:300]}); training eagerly"
                self.cohort.compile_fallback = self.fallback
                log.warning("cohort: %s", self.fallback)
        return eager(*args)

    # -- one epoch --------------------------------------------------------------------------

    def train_pass(self, active: list) -> list[list]:
        """The cohort's train pass for ``active`` (rows of the stack that still run); eager's result shape."""
        cohort, rows = self.cohort, self.rows
        training = rows[0].config.training
        size, batch_size = cohort.train_tensors["target"].shape[1], training.batch_size
        alive = tuple(m.status == TrainingStatus.RUNNING for m in rows)
        alive_tensor = torch.tensor(alive, device=cohort.device)
        running = torch.tensor([k for k, a in enumerate(alive) if a], dtype=torch.long)
        order = torch.stack([torch.randperm(size, generator=m.trainer.batch_generator) if a else torch.arange(size)
                             for m, a in zip(rows, alive, strict=True)])
        dtype = upcast(next(iter(cohort.params.values()))).dtype
        autocast = (torch.autocast("cuda", dtype=torch.bfloat16)
                    if training.bf16 and cohort.device.type == "cuda" else contextlib.nullcontext())
        source = cohort.train_source.unsqueeze(1)
        sums = [{} for _ in self._groups]
        counts = [0 for _ in self._groups]
        losses: list[list[torch.Tensor]] = [[] for _ in self._groups]
        terms: list[list[dict]] = [[] for _ in self._groups]
        epoch = active[0].trainer.epoch
        if train_phases.resets_decoder(training, epoch):
            phases.reset_decoders(cohort, active)
        batches = order.split(batch_size, dim=1)
        for position, part in train_phases.update_plan(len(batches), training, epoch):
            indices, counted = batches[position], train_phases.counted(part)
            real = indices.shape[1]
            bucket = self._bucket(running, indices)
            padded = torch.cat([indices, indices.new_zeros(len(rows), batch_size - real)], dim=1)
            padded = padded.to(cohort.device)
            batch = {k: v[source, padded] for k, v in cohort.train_tensors.items()}
            batch["mask"][:, real:] = False  # padding rows: no active token, so they count for nothing
            draws = self._draws(alive, real, batch_size)
            batch["dropped"] = draws[1]
            for key in (*TARGET_SIDE, "dropped"):
                if batch[key] is not None:
                    batch[key] = batch[key][..., :bucket]
            rows[0].trainer.model.step = cohort.step
            temperature = torch.tensor(rows[0].trainer.model.gumbel_temperature(), dtype=dtype, device=cohort.device)
            weights = self._step_weights(cohort.step, dtype)
            inject = [m.config.training.inject_nan_at_step == cohort.step and a and counted
                      for m, a in zip(rows, alive, strict=True)]
            scale = torch.tensor([math.nan if bad else 1.0 for bad in inject], dtype=dtype, device=cohort.device)
            started, warm_up = time.perf_counter(), bucket not in self._warm
            with autocast:
                loss, per_group = self._call(self._loss, self._loss_fn, cohort.params, batch["context"],
                                             batch["decoder_input"], batch["target"], batch["mask"],
                                             batch["base_nll"], (draws[0], batch["dropped"]), temperature,
                                             weights, scale, alive_tensor)
            loss.backward()
            names = phases.part_names(cohort.params, part) or list(cohort.params)
            grads = {n: cohort.params[n].grad for n in names if cohort.params[n].grad is not None}
            used = self._step_used([tuple(w.tolist()) for w in weights], alive)
            self._call(self._update, self._update_fn, grads, used)
            for param in cohort.params.values():
                param.grad = None
            if warm_up:
                self._warm.add(bucket)
                self.compile_seconds += time.perf_counter() - started
            if not counted:  # an encoder-only update: not a logged step (as alone)
                continue
            for g, (total, term_values, values, count) in enumerate(per_group):
                for key, value in values.items():
                    sums[g][key] = sums[g].get(key, 0.0) + value * count
                counts[g] = counts[g] + count
                losses[g].append(total)
                terms[g].append(term_values)
            cohort.step += 1
        groups = [(g["index"], g["positions"], None) for g in self._groups]
        by_row = per_member(rows, groups, sums, counts, losses, terms)
        return [[column[rows.index(m)] for m in active] for column in by_row]

    def _draws(self, alive: tuple[bool, ...], real: int, batch_size: int) -> Draws:
        """Running members' draws from their own streams (as eager); zeros (nothing dropped) for
        padding and stopped rows."""
        running = [m for m, a in zip(self.rows, alive, strict=True) if a]
        rows = torch.tensor([k for k, a in enumerate(alive) if a], device=self.cohort.device)
        padded = []
        for drawn in member_draws(self.cohort, [m.generator for m in running], real):
            if drawn is not None:
                full = drawn.new_zeros(len(self.rows), batch_size, *drawn.shape[2:])
                full[rows, :real] = drawn
                drawn = full
            padded.append(drawn)
        return padded[0], padded[1]
