"""Synthetic strategy task: config, generator and split container.

Each example has a context ``x`` of content tokens and a hidden strategy ``s``.
The target ``y`` is a short prefix drawn from ``s``'s private block of prefix
tokens (high surprisal for any model without ``s``), followed by a body that
``s`` and ``x`` determine up to light noise and optional distractor tokens.

Vocabulary layout (ids are int64)::

    0                                  PAD
    1                                  BOS
    [2, 2 + V)                         content tokens (V = content_vocab)
    [prefix_token_start + s*m, +m)     prefix block of strategy s (m = prefix_tokens_per_strategy)
    [distractor_token_start, +D)       distractor tokens (D = num_distractor_tokens)

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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from workers.data.config import (
    BOS_ID,
    CONTENT_START,
    PAD_ID,
    SplitName,
    SyntheticTaskConfig,
)

_SPLIT_INDEX: dict[str, int] = {"train": 0, "val": 1}


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
        context: Context tokens, shape ``[*B, context_length]``.
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
        context: ``[N, context_length]`` int64 content tokens.
        target: ``[N, T]`` int64, ``T = max_target_length``; PAD off the mask.
        mask: ``[N, T]`` bool, True on the ``P + L`` active positions (always a
            leading contiguous run).
        strategy: ``[N]`` int64 true strategy, for evaluation only; models must
            not read it.
    """

    context: torch.Tensor
    target: torch.Tensor
    mask: torch.Tensor
    strategy: torch.Tensor

    def __len__(self) -> int:
        return int(self.context.shape[0])

    def subset(self, indices: torch.Tensor | np.ndarray | slice | list[int]) -> SyntheticSplit:
        """Rows selected by ``indices`` (any torch first-dim index: slice, ints, bool mask)."""
        if isinstance(indices, np.ndarray):
            indices = torch.from_numpy(indices)
        elif isinstance(indices, list):
            indices = torch.as_tensor(indices, dtype=torch.long)
        if isinstance(indices, torch.Tensor):
            indices = indices.to(self.context.device)
        return SyntheticSplit(
            context=self.context[indices],
            target=self.target[indices],
            mask=self.mask[indices],
            strategy=self.strategy[indices],
        )

    def to(self, device: torch.device | str) -> SyntheticSplit:
        """Copy of the split with every tensor moved to ``device``."""
        return SyntheticSplit(
            context=self.context.to(device),
            target=self.target.to(device),
            mask=self.mask.to(device),
            strategy=self.strategy.to(device),
        )

    def decoder_input(self) -> torch.Tensor:
        """Teacher-forcing input: ``target`` shifted right with BOS at position 0.

        Position ``t`` holds ``y_{t-1}``; the last target token is dropped. Past
        the end of the mask the input is PAD (or the final active token at the
        first off-mask position), which a causal decoder never uses for loss.
        """
        bos = torch.full_like(self.target[:, :1], BOS_ID)
        return torch.cat([bos, self.target[:, :-1]], dim=1)


def _generate(config: SyntheticTaskConfig, n: int, rng: np.random.Generator) -> SyntheticSplit:
    k = config.num_strategies
    m = config.prefix_tokens_per_strategy
    p = config.prefix_length
    lmax = config.body_length_max
    v = config.content_vocab
    t_len = config.max_target_length

    # Draws are made for every padded body slot and then masked, which keeps
    # the random stream (and thus the data) a fixed function of the config.
    strategy = rng.integers(0, k, size=n, dtype=np.int64)
    context = rng.integers(CONTENT_START, CONTENT_START + v, size=(n, config.context_length))
    body_len = rng.integers(config.body_length_min, lmax + 1, size=n, dtype=np.int64)
    prefix = (
        config.prefix_token_start
        + strategy[:, None] * m
        + rng.integers(0, m, size=(n, p), dtype=np.int64)
    )
    u_distract = rng.random(size=(n, lmax))
    u_noise = rng.random(size=(n, lmax))
    noise_tok = rng.integers(CONTENT_START, CONTENT_START + v, size=(n, lmax), dtype=np.int64)
    distract_tok = rng.integers(
        config.distractor_token_start,
        config.vocab_size,
        size=(n, lmax),
        dtype=np.int64,
    )

    j = np.arange(lmax, dtype=np.int64)
    body = _body_tokens_np(config, strategy[:, None], context[:, None, :], j[None, :])
    body = np.where(u_noise < config.noise_rate, noise_tok, body)
    body = np.where(u_distract < config.distractor_rate, distract_tok, body)

    mask = np.arange(t_len)[None, :] < (p + body_len)[:, None]
    target = np.concatenate([prefix, body], axis=1)
    target = np.where(mask, target, PAD_ID)

    return SyntheticSplit(
        context=torch.from_numpy(np.ascontiguousarray(context, dtype=np.int64)),
        target=torch.from_numpy(np.ascontiguousarray(target, dtype=np.int64)),
        mask=torch.from_numpy(np.ascontiguousarray(mask)),
        strategy=torch.from_numpy(strategy),
    )


def generate_split(config: SyntheticTaskConfig, split: SplitName) -> SyntheticSplit:
    """Generate the ``train`` or ``val`` split.

    The two splits come from independent children of
    ``np.random.SeedSequence(config.seed)``, so each split is a deterministic
    function of the config alone and does not depend on whether the other
    split was generated.

    Raises:
        ValueError: If ``split`` is not ``"train"`` or ``"val"``.
    """
    if split not in _SPLIT_INDEX:
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    child = np.random.SeedSequence(config.seed).spawn(len(_SPLIT_INDEX))[_SPLIT_INDEX[split]]
    rng = np.random.Generator(np.random.PCG64(child))
    n = config.train_size if split == "train" else config.val_size
    return _generate(config, n, rng)


def generate_task(config: SyntheticTaskConfig) -> tuple[SyntheticSplit, SyntheticSplit]:
    """Return ``(train, val)`` splits for ``config``."""
    return generate_split(config, "train"), generate_split(config, "val")
