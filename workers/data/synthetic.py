"""The synthetic strategy task: its generator and split container (the config: ``config.py``).

Each example has a context ``x`` of content tokens, a hidden strategy ``s`` and a kind
(``prefix``, ``diffuse``, ``private``) that says where in the target ``y`` the strategy shows;
a deterministic body rule makes the strategies' bodies differ at every position
(:func:`generate_split` defines the kinds and the rule).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields

import numpy as np
import torch

from workers.contract import SPLITS
from workers.data.config import (
    BOS_ID,
    CONTENT_START,
    KINDS,
    PAD_ID,
    SplitName,
    SyntheticTaskConfig,
)

_SPLIT_INDEX: dict[str, int] = {name: index for index, name in enumerate(SPLITS)}


def strategy_constants(config: SyntheticTaskConfig) -> tuple[np.ndarray, np.ndarray]:
    """Return the body-rule constants ``(a, c)``, each int64 of shape ``[K]``.

    They depend only on ``num_strategies`` and ``content_vocab`` (never on the
    seed), so the same strategy index means the same rule across seeds.
    """
    s = np.arange(config.num_strategies, dtype=np.int64)
    v = config.content_vocab
    a = 1 + (2 * s) % (v - 1)
    c = s % v
    return a, c


def _body_tokens_np(
    config: SyntheticTaskConfig, strategy: np.ndarray, context: np.ndarray, position: np.ndarray
) -> np.ndarray:
    strategy = np.asarray(strategy, dtype=np.int64)
    context = np.asarray(context, dtype=np.int64)
    position = np.asarray(position, dtype=np.int64)
    if context.ndim < 1 or context.shape[-1] != config.context_length:
        raise ValueError(
            f"context must have trailing dimension context_length={config.context_length}, "
            f"got shape {context.shape}"
        )
    if np.any(strategy < 0) or np.any(strategy >= config.num_strategies):
        raise ValueError(f"strategy ids must lie in [0, {config.num_strategies})")
    if np.any(position < 0):
        raise ValueError("body positions must be non-negative")
    shape = np.broadcast_shapes(strategy.shape, position.shape, context.shape[:-1])
    ctx = np.broadcast_to(context, (*shape, config.context_length))
    pos = np.broadcast_to(position, shape)
    x_j = np.take_along_axis(ctx, (pos % config.context_length)[..., None], axis=-1)[..., 0]
    a, c = strategy_constants(config)
    s = np.broadcast_to(strategy, shape)
    v = config.content_vocab
    return CONTENT_START + (a[s] * (x_j - CONTENT_START) + c[s] + pos) % v


def strategy_body_token(
    config: SyntheticTaskConfig,
    strategy: torch.Tensor | np.ndarray | int,
    context: torch.Tensor | np.ndarray,
    position: torch.Tensor | np.ndarray | int,
) -> torch.Tensor | np.ndarray:
    """Deterministic body token ``f_s(x, j)`` (see the module docstring).

    Args:
        config: Task config.
        strategy: Strategy ids in ``[0, K)``, shape ``S``.
        context: Context content tokens, shape ``[*B, context_length]`` (without the
            mixed task's kind marker).
        position: 0-based body positions ``j`` (not target positions), shape ``J``.
            ``j`` may exceed ``context_length``; the context is read cyclically.

    Returns:
        int64 tokens of shape ``broadcast(S, B, J)``; a ``torch.Tensor`` (on the
        context's device) if ``context`` is a tensor, else a numpy array.

    Raises:
        ValueError: On a wrong context width, out-of-range strategy or negative position.
    """
    as_torch = isinstance(context, torch.Tensor)
    device = context.device if as_torch else None

    def _np(v: torch.Tensor | np.ndarray | int) -> np.ndarray:
        return v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v)

    out = _body_tokens_np(config, _np(strategy), _np(context), _np(position))
    if as_torch:
        return torch.from_numpy(np.ascontiguousarray(out)).to(device)
    return out


@dataclass(frozen=True)
class SyntheticSplit:
    """One split of the synthetic task.

    Attributes:
        context: ``[N, input_context_length]`` int64: the content tokens, plus the kind
            marker as the last column in the mixed task.
        target: ``[N, T]`` int64, ``T = max_target_length``; PAD off the mask.
        mask: ``[N, T]`` bool, True on the ``P + L`` active positions (always a
            leading contiguous run).
        strategy: ``[N]`` int64 true strategy, for evaluation only; models must
            not read it.
        kind: ``[N]`` int64 example kind, an index into ``KINDS`` (all 0 in the single-kind task).
    """

    context: torch.Tensor
    target: torch.Tensor
    mask: torch.Tensor
    strategy: torch.Tensor
    kind: torch.Tensor

    def __len__(self) -> int:
        return int(self.context.shape[0])

    def _map(self, fn) -> SyntheticSplit:
        return SyntheticSplit(**{f.name: fn(getattr(self, f.name)) for f in fields(self)})

    def subset(self, indices: torch.Tensor | np.ndarray | slice | list[int]) -> SyntheticSplit:
        """Rows selected by ``indices`` (any torch first-dim index: slice, ints, bool mask)."""
        if isinstance(indices, np.ndarray):
            indices = torch.from_numpy(indices)
        elif isinstance(indices, list):
            indices = torch.as_tensor(indices, dtype=torch.long)
        if isinstance(indices, torch.Tensor):
            indices = indices.to(self.context.device)
        return self._map(lambda tensor: tensor[indices])

    def to(self, device: torch.device | str) -> SyntheticSplit:
        """Copy of the split with every tensor moved to ``device``."""
        return self._map(lambda tensor: tensor.to(device))

    def replace(self, **tensors: torch.Tensor) -> SyntheticSplit:
        """A copy with some fields replaced (e.g. corrupted labels in a test)."""
        return SyntheticSplit(**{f.name: tensors.get(f.name, getattr(self, f.name)) for f in fields(self)})

    def content_context(self, config: SyntheticTaskConfig) -> torch.Tensor:
        """The ``context_length`` content tokens (the kind marker dropped)."""
        return self.context[:, : config.context_length]

    def data_hash(self) -> str:
        """sha256 (first 16 hex digits) of context, target, mask, strategy and kind."""
        digest = hashlib.sha256()
        for f in fields(self):
            digest.update(getattr(self, f.name).detach().cpu().contiguous().numpy().tobytes())
        return digest.hexdigest()[:16]

    def decoder_input(self) -> torch.Tensor:
        """Teacher-forcing input: ``target`` shifted right with BOS at position 0.

        Position ``t`` holds ``y_{t-1}``; the last target token is dropped. Past
        the end of the mask the input is PAD (or the final active token at the
        first off-mask position), which a causal decoder never uses for loss.
        """
        bos = torch.full_like(self.target[:, :1], BOS_ID)
        return torch.cat([bos, self.target[:, :-1]], dim=1)


def kind_layout(config: SyntheticTaskConfig, kind: torch.Tensor | np.ndarray):
    """Per-example prefix length (body offset) and body noise rate for kind ids ``kind``.

    Returns:
        ``(offset, noise)``: int64 and float64 arrays (numpy, or torch on ``kind``'s
        device) of ``kind``'s shape. ``prefix`` and ``private``: offset ``P``;
        ``diffuse``: 0. Noise: ``noise_rate`` (prefix), ``diffuse_noise_rate`` (diffuse),
        ``private_noise_rate`` (private; ``noise_rate`` when unset).
    """
    offsets = [config.prefix_length, 0, config.prefix_length]
    private = config.noise_rate if config.private_noise_rate is None else config.private_noise_rate
    noises = [config.noise_rate, config.diffuse_noise_rate, private]
    if isinstance(kind, torch.Tensor):
        return (torch.tensor(offsets, device=kind.device)[kind],
                torch.tensor(noises, dtype=torch.float64, device=kind.device)[kind])
    return np.asarray(offsets, dtype=np.int64)[kind], np.asarray(noises)[kind]


def _generate(config: SyntheticTaskConfig, n: int, rng: np.random.Generator) -> SyntheticSplit:
    k = config.num_strategies
    m = config.prefix_tokens_per_strategy
    p = config.prefix_length
    lmax = config.body_length_max
    v = config.content_vocab
    t_len = config.max_target_length

    # Draws are made for every padded body slot and then masked, which keeps
    # the random stream (and thus the data) a fixed function of the config. The mixed
    # task's extra draws come after the single-kind task's, which therefore does not depend on them.
    strategy = rng.integers(0, k, size=n, dtype=np.int64)
    context = rng.integers(CONTENT_START, CONTENT_START + v, size=(n, config.context_length))
    body_len = rng.integers(config.body_length_min, lmax + 1, size=n, dtype=np.int64)
    prefix = (
        config.prefix_token_start
        + strategy[:, None] * m
        + rng.integers(0, m, size=(n, p), dtype=np.int64)
    )

    def body_draws(width: int) -> tuple[np.ndarray, ...]:
        return (
            rng.random(size=(n, width)),
            rng.random(size=(n, width)),
            rng.integers(CONTENT_START, CONTENT_START + v, size=(n, width), dtype=np.int64),
            rng.integers(config.distractor_token_start, config.private_token_start,
                         size=(n, width), dtype=np.int64),
        )

    u_distract, u_noise, noise_tok, distract_tok = body_draws(lmax)
    kind = np.zeros(n, dtype=np.int64)
    if config.mixed:
        kind = rng.choice(len(KINDS), size=n, p=np.asarray(config.kind_proportions.probabilities()))
        private = np.concatenate([
            config.private_token_start
            + rng.integers(0, config.resolved_private_prefix_tokens, size=(n, 1), dtype=np.int64),
            config.private_tail_start + rng.integers(0, m, size=(n, p - 1), dtype=np.int64),
        ], axis=1)
        # Per target position: the p extra draws serve diffuse examples' first p body tokens.
        extra = body_draws(p)
        u_distract, u_noise, noise_tok, distract_tok = (
            np.concatenate([e, d], axis=1)
            for e, d in zip(extra, (u_distract, u_noise, noise_tok, distract_tok), strict=True)
        )
        offset, noise = kind_layout(config, kind)
        j = np.maximum(np.arange(t_len)[None, :] - offset[:, None], 0)
        body = _body_tokens_np(config, strategy[:, None], context[:, None, :], j)
        body = np.where(u_noise < noise[:, None], noise_tok, body)
        body = np.where(u_distract < config.distractor_rate, distract_tok, body)
        head = np.where((kind == KINDS.index("private"))[:, None], private, prefix)
        is_prefix = np.arange(t_len)[None, :] < offset[:, None]
        target = np.where(is_prefix, np.pad(head, ((0, 0), (0, t_len - p))), body)
        context = np.concatenate([context, config.kind_token_start + kind[:, None]], axis=1)
    else:
        j = np.arange(lmax, dtype=np.int64)
        body = _body_tokens_np(config, strategy[:, None], context[:, None, :], j[None, :])
        body = np.where(u_noise < config.noise_rate, noise_tok, body)
        body = np.where(u_distract < config.distractor_rate, distract_tok, body)
        target = np.concatenate([prefix, body], axis=1)

    mask = np.arange(t_len)[None, :] < (p + body_len)[:, None]
    target = np.where(mask, target, PAD_ID)

    return SyntheticSplit(
        context=torch.from_numpy(np.ascontiguousarray(context, dtype=np.int64)),
        target=torch.from_numpy(np.ascontiguousarray(target, dtype=np.int64)),
        mask=torch.from_numpy(np.ascontiguousarray(mask)),
        strategy=torch.from_numpy(strategy),
        kind=torch.from_numpy(np.ascontiguousarray(kind, dtype=np.int64)),
    )


def generate_split(config: SyntheticTaskConfig, split: SplitName) -> SyntheticSplit:
    """Generate the ``train``, ``val`` or ``test`` split.

    Each example has a context ``x`` of content tokens, a hidden strategy ``s`` and a *kind*.
    Every example's target ``y`` has ``P + L`` active tokens (L drawn per example); what they
    are depends on the kind:

    - ``prefix`` (the single-kind default): ``P`` prefix tokens from ``s``'s block of prefix tokens
      (high surprisal for any model without ``s``, explained by ``s``), then a body
      ``f_s(x, j)``, ``j = t - P``, up to ``noise_rate``.
    - ``diffuse``: no prefix; all ``P + L`` tokens are body, ``j = t``, with the high
      ``diffuse_noise_rate``, so every token reveals ``s`` a little.
    - ``private``: ``P`` prefix tokens that ``s`` does not explain: the first uniform over
      the private block of ``M`` tokens (``log M`` nats with or without ``s``), the others
      uniform over a tail block of ``m`` tokens (``log m``, like a strategy prefix's),
      then a body ``f_s(x, j)``, ``j = t - P``, up to ``private_noise_rate`` (default
      ``noise_rate``): ``s`` shows only in the body, at low surprisal. ``M`` is chosen so
      the kappa of ``private`` examples matches ``prefix`` examples (``calibration.py``).

    Body tokens can also be distractors (``distractor_rate``, every kind). In the mixed task
    the context carries one kind-marker token after its ``context_length`` content tokens, so
    the z-free base model (oracle or learned) knows the kind; ``s`` is never observed.

    Deterministic body rule (``j`` = 0-based body position, ``C`` = context_length)::

        f_s(x, j) = 2 + (a_s * (x[j mod C] - 2) + c_s + j) mod V
        a_s = 1 + (2*s mod (V - 1))
        c_s = s mod V

    ``a_s`` lies in ``[1, V-1]``, so it is never 0 mod V and every body token
    depends on the context. For ``K <= V`` the offsets ``c_s`` are distinct, so no
    two strategies share the same ``(a_s, c_s)`` pair; for the defaults (V=16,
    K=4) ``f_s(x, j) - f_r(x, j) = (s - r) * (2*(x - 2) + 1) mod 16`` is never 0,
    i.e. the bodies of different strategies differ at every position. For
    ``K > V`` some strategies may share a body rule; they remain identifiable from
    their disjoint prefix blocks.

    The splits come from independent children of ``np.random.SeedSequence(data_seed)``
    (child 0 train, 1 val, 2 test), so each split is a deterministic function of the
    config alone and does not depend on whether another split was generated.

    Raises:
        ValueError: If ``split`` is not ``"train"``, ``"val"`` or ``"test"``.
    """
    if split not in _SPLIT_INDEX:
        raise ValueError(f"split must be 'train', 'val' or 'test', got {split!r}")
    child = np.random.SeedSequence(config.data_seed).spawn(len(_SPLIT_INDEX))[_SPLIT_INDEX[split]]
    rng = np.random.Generator(np.random.PCG64(child))
    n = {"train": config.train_size, "val": config.val_size, "test": config.test_size}[split]
    return _generate(config, n, rng)


def generate_task(config: SyntheticTaskConfig) -> tuple[SyntheticSplit, SyntheticSplit]:
    """Return ``(train, val)`` splits for ``config``."""
    return generate_split(config, "train"), generate_split(config, "val")


def generate_splits(config: SyntheticTaskConfig) -> dict[str, SyntheticSplit]:
    """All three splits: ``{"train": ..., "val": ..., "test": ...}``."""
    return {name: generate_split(config, name) for name in SPLITS}  # type: ignore[arg-type]
