"""A planted positive control: a registered dataset with a label whose evidence sits where we say.

The caveat of R~ (each example divided by its kappa_alpha) predicts R~ - R_tok < 0 when a
label's evidence sits in the concentrated (high-kappa) examples and > 0 when it sits in the
diffuse (low-kappa) ones. On real text nobody knows where a label's evidence sits; here it is
planted. From a source dataset's rows (their ``y`` ids, ``x`` and split):

1. a random **label**, 0 or 1, balanced within every split (seeded): nothing in the source
   text says anything about it;
2. two **evidence tokens**, one per label (by default the two smallest ids that occur nowhere
   in the source, so they carry the planted label and nothing else);
3. the **carriers**, ``fraction`` of each (split, label) cell, the same number in every
   variant: each gets its label's token once, at a seeded place in ``y`` (start, end or
   random; the same place in every variant). They are the cell's rows of highest kappa_alpha
   (``concentrated``), of lowest (``diffuse``), or drawn at random (``null``). No other row
   changes.

The information planted is the same in the three variants by construction: the token is
present in the carriers only and names their label, so I(label; evidence) = (carriers / rows)
x log 2 nats (:func:`planted_information` measures it).

**The planted token's surprisal** (``surprisal``):

- ``matched`` (the default): its b_t is the value that leaves the row's kappa_alpha exactly
  as it was (the larger root, at or above the row's surprisal-weighted mean b_t: an ordinary,
  somewhat informative token to R_tok's weights), and the row's other tokens keep the source
  base's b_t. The carriers then stay in the kappa group they were chosen from, and kappa before
  and after planting are equal to rounding. The variants carry these b_t as ``base_nll``:
  train them with ``base.kind: precomputed``, or the sweep's base re-scores the rows.
- ``base``: the base itself scores the planted rows (re-fitted on each variant: a unigram's
  counts, or a causal LM reading the token in context). A token absent from the source is
  surprising to either, so planting raises a carrier's kappa: the carriers are then chosen by
  their kappa *with* the token, and the table shows how far kappa moved and how many carriers
  are still in their declared group.

Torch-free: the base is a callable (:data:`BaseFit`); :func:`unigram_base` is the default.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from workers.contract import SPLITS

VARIANTS: tuple[str, ...] = ("concentrated", "diffuse", "null")
EVIDENCE_GROUP, PLAIN_GROUP = "evidence", "none"

Rows = Sequence[Sequence[int]]
Scorer = Callable[[Rows, Rows], list[np.ndarray]]
BaseFit = Callable[[Rows, Rows, np.ndarray], Scorer]
"""(xs, ys, split index per row) -> a scorer (xs, ys) -> b_t per token of each y (nats)."""


def unigram_base(xs: Rows, ys: Rows, split: np.ndarray) -> Scorer:
    """b_t = -log p(t) under the train split's y tokens, add-one smoothed over the ids
    0..max id + 1 of the rows it is fitted on (the label gate's unigram base)."""
    counts = Counter(t for i in np.flatnonzero(split == 0) for t in ys[i])
    vocab = max(max(y) for y in ys) + 2
    total = sum(counts.values()) + vocab

    def score(_xs: Rows, rows: Rows) -> list[np.ndarray]:
        return [np.array([-np.log((counts[t] + 1) / total) for t in y], np.float64) for y in rows]

    return score


def kappa(rows: Sequence[np.ndarray], alpha: float) -> np.ndarray:
    """kappa_alpha = m_{alpha+1} / (m_alpha m_1) of each row of b_t (m_r: the mean of b^r), as
    ``objectives.token_weight_stats`` defines it: 1 at alpha 0 and on a row of zeros."""
    out = np.ones(len(rows))
    if alpha == 0:
        return out
    for i, row in enumerate(rows):
        b = np.asarray(row, dtype=np.float64)
        b = b[b > 0] / b.max() if (b > 0).any() else b[:0]
        if b.size:  # zeros weigh 0 in every sum but count in n
            n = len(row)
            out[i] = max(1.0, n * (b ** (alpha + 1)).sum() / ((b ** alpha).sum() * b.sum()))
    return out


def balanced_labels(split: np.ndarray, seed: int) -> np.ndarray:
    """0 or 1 per row, half of each split each (an odd split's extra row drawn at random)."""
    rng = np.random.default_rng(seed)
    labels = np.zeros(len(split), np.int64)
    for index in np.unique(split):
        rows = np.flatnonzero(split == index)
        ones = rng.permutation(rows)[:len(rows) // 2 + (rng.random() < 0.5) * (len(rows) % 2)]
        labels[ones] = 1
    return labels


def absent_tokens(ys: Rows) -> tuple[int, int]:
    """The two smallest ids that occur in no row: the evidence then says nothing but the planted
    label (a token that also occurs naturally would blur it, and differently in each variant).
    Bytes: 0 and 1 (control characters no text holds); a model's tokenizer: often special
    tokens, surprising to its LM."""
    seen = {t for y in ys for t in y}
    free = [t for t in range(len(seen) + 2) if t not in seen]
    return free[0], free[1]


def insert_positions(ys: Rows, where: str, seed: int) -> np.ndarray:
    """Where each row's evidence goes: 0 (start), len(y) (end) or a seeded place in 0..len(y)."""
    lengths = np.array([len(y) for y in ys])
    if where == "start":
        return np.zeros(len(ys), np.int64)
    if where == "end":
        return lengths
    return np.random.default_rng(seed + 1).integers(0, lengths + 1)


def planted_information(ys: Rows, labels: np.ndarray, tokens: tuple[int, int]) -> float:
    """Plug-in I(label; evidence) in nats, evidence = (token 0 present, token 1 present)."""
    state = np.array([2 * (tokens[0] in y) + (tokens[1] in y) for y in ys])
    joint = np.zeros((2, 4))
    np.add.at(joint, (labels, state), 1.0)
    joint /= joint.sum()
    outer = joint.sum(1, keepdims=True) @ joint.sum(0, keepdims=True)
    nonzero = joint > 0
    return float((joint[nonzero] * np.log(joint[nonzero] / outer[nonzero])).sum())


def _quartiles(values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return {"mean": float("nan"), "q25": float("nan"), "q50": float("nan"), "q75": float("nan")}
    q25, q50, q75 = np.quantile(values, [0.25, 0.5, 0.75])
    return {"mean": float(values.mean()), "q25": float(q25), "q50": float(q50), "q75": float(q75)}


@dataclass
class PlantedVariant:
    """One variant: its rows, which carry evidence, and kappa before and after planting."""

    variant: str
    ys: list[list[int]]
    carriers: np.ndarray  # bool [N]
    base_after: list[np.ndarray]  # b_t of the planted rows under the base re-fitted on them
    kappa_before: np.ndarray  # the source rows under the source's base
    kappa_after: np.ndarray
    summary: dict[str, Any] = field(default_factory=dict)


@dataclass
class Planted:
    """The three variants and what they share."""

    labels: np.ndarray
    tokens: tuple[int, int]
    positions: np.ndarray
    variants: dict[str, PlantedVariant]
    config: dict[str, Any]


def _choose(kappa_candidate: np.ndarray, split: np.ndarray, labels: np.ndarray, fraction: float,
            variant: str, rng: np.random.Generator) -> np.ndarray:
    carriers = np.zeros(len(split), bool)
    for index in np.unique(split):
        for label in (0, 1):
            rows = np.flatnonzero((split == index) & (labels == label))
            count = int(round(fraction * len(rows)))
            if variant == "null":
                chosen = rng.permutation(rows)[:count]
            else:  # stable order: ties broken by row index, the same in both directions
                order = rows[np.argsort(kappa_candidate[rows], kind="stable")]
                chosen = order[len(order) - count:] if variant == "concentrated" else order[:count]
            carriers[chosen] = True
    return carriers


def _kappa_with(b: np.ndarray, x: np.ndarray, alpha: float) -> np.ndarray:
    """kappa_alpha of ``b`` with one more token of b_t ``x``, for every ``x`` (vectorised)."""
    positive = b[b > 0]
    n = b.size + 1
    s_alpha, s_next, s_one = ((positive ** r).sum() for r in (alpha, alpha + 1, 1.0))
    return n * (s_next + x ** (alpha + 1)) / ((s_alpha + x ** alpha) * (s_one + x))


def matched_surprisal(row: np.ndarray, alpha: float) -> float:
    """The b_t of one more token that leaves ``row``'s kappa_alpha unchanged: the root of
    kappa(row + [x]) = kappa(row) at or above the argmin of the left side (kappa(row + [x])
    falls to a minimum of at most kappa(row), then grows without bound; bisection). At alpha 0
    kappa is 1 whatever x, and on a row of zeros too: the row's mean b_t then."""
    b = np.asarray(row, dtype=np.float64)
    if alpha == 0 or not (b > 0).any():
        return float(b.mean()) if b.size else 0.0
    target = kappa([b], alpha)[0]
    grid = np.linspace(0.0, 4.0 * b.max(), 401)[1:]
    low = float(grid[int(np.argmin(_kappa_with(b, grid, alpha)))])
    high = 2 * low
    while _kappa_with(b, np.array([high]), alpha)[0] < target:
        high *= 2
    for _ in range(60):  # the bracket shrinks 2^60-fold: to rounding
        mid = (low + high) / 2
        if _kappa_with(b, np.array([mid]), alpha)[0] < target:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def _written(y: Sequence[int], position: int, token: int) -> list[int]:
    return [*y[:position], token, *y[position:]]


def plant(xs: Rows, ys: Rows, split: np.ndarray, *, alpha: float = 1.0, fraction: float = 0.25,
          seed: int = 0, tokens: tuple[int, int] | None = None,
          position: Literal["start", "end", "random"] = "random",
          surprisal: Literal["matched", "base"] = "matched", base: BaseFit = unigram_base) -> Planted:
    """The three variants of the module doc from a source's rows.

    Args:
        xs, ys: the source's contexts and targets (ids), one list per row.
        split: 0 train, 1 val, 2 test per row.
        alpha: the kappa_alpha that chooses the carriers and is reported.
        fraction: the share of each (split, label) cell that carries evidence, in (0, 0.5].
        tokens: the evidence ids of label 0 and label 1 (default :func:`absent_tokens`).
        position: where the evidence token goes in ``y``.
        surprisal: the planted token's b_t: ``matched`` (kappa unchanged) or ``base``.
        base: fits b_t on a dataset's rows (default: a unigram of the train split).

    Raises:
        ValueError: a fraction outside (0, 0.5], equal tokens, or a split of fewer than 4 rows.
    """
    if not 0 < fraction <= 0.5:
        raise ValueError(f"fraction {fraction} must be in (0, 0.5]: the carriers are the top or "
                         "bottom group of each cell, never more than half of it")
    split = np.asarray(split)
    for index, name in enumerate(SPLITS):
        if 0 < (split == index).sum() < 4:
            raise ValueError(f"split {name!r} has {(split == index).sum()} rows: a planted control "
                             "needs at least 4 per split (2 per label)")
    tokens = tokens or absent_tokens(ys)
    if tokens[0] == tokens[1]:
        raise ValueError(f"the two evidence tokens are both {tokens[0]}: give two different ids")
    labels = balanced_labels(split, seed)
    positions = insert_positions(ys, position, seed)
    source_b = base(xs, ys, split)(xs, ys)
    kappa_before = kappa(source_b, alpha)
    candidates = [_written(y, p, tokens[lab]) for y, p, lab in zip(ys, positions, labels, strict=True)]
    rng = np.random.default_rng(seed + 2)
    null = _choose(np.zeros(len(ys)), split, labels, fraction, "null", rng)
    if surprisal == "matched":
        ranking = kappa_before  # planting leaves every kappa as it was
        matched = [matched_surprisal(b, alpha) for b in source_b]
    else:  # the carriers' kappa with their token, under a base fitted on a planted dataset
        provisional = [c if carry else list(y) for c, y, carry in zip(candidates, ys, null, strict=True)]
        ranking = kappa(base(xs, provisional, split)(xs, candidates), alpha)
    variants = {}
    for variant in VARIANTS:
        carriers = null if variant == "null" else _choose(ranking, split, labels, fraction,
                                                          variant, rng)
        rows = [c if carry else list(y) for c, y, carry in zip(candidates, ys, carriers, strict=True)]
        if surprisal == "matched":
            after = [np.insert(b, p, x) if carry else np.asarray(b)
                     for b, p, x, carry in zip(source_b, positions, matched, carriers, strict=True)]
        else:
            after = base(xs, rows, split)(xs, rows)  # re-fitted on this variant's own rows
        variants[variant] = PlantedVariant(variant, rows, carriers, after, kappa_before,
                                           kappa(after, alpha))
    config = {"alpha": alpha, "fraction": fraction, "seed": seed, "tokens": list(tokens),
              "position": position, "surprisal": surprisal}
    planted = Planted(labels, tokens, positions, variants, config)
    for entry in variants.values():
        entry.summary = summarize_variant(entry, planted, split)
    return planted


def summarize_variant(entry: PlantedVariant, planted: Planted, split: np.ndarray) -> dict[str, Any]:
    """Rows planted per split, kappa of the evidence rows before and after (mean, quartiles),
    of the other rows after, the share of evidence rows in the variant's declared group (the
    top ``fraction`` of kappa after for concentrated, the bottom for diffuse; null: the top,
    which it should hit about ``fraction`` of the time), the planted tokens' mean b_t, and
    I(label; evidence) in nats over all rows and over train."""
    fraction = planted.config["fraction"]
    carriers, after = entry.carriers, entry.kappa_after
    top, bottom = np.quantile(after, [1 - fraction, fraction])
    in_group = (after[carriers] <= bottom) if entry.variant == "diffuse" else (after[carriers] >= top)
    token_b = [b[p] for b, p, carry in zip(entry.base_after, planted.positions, carriers, strict=True)
               if carry]
    train = split == 0
    return {
        "variant": entry.variant,
        "rows_planted": {name: int((carriers & (split == i)).sum()) for i, name in enumerate(SPLITS)},
        "rows": len(carriers),
        "labels": {str(c): int((planted.labels == c).sum()) for c in (0, 1)},
        "kappa_before": _quartiles(entry.kappa_before[carriers]),
        "kappa_after": _quartiles(after[carriers]),
        "kappa_after_other_rows": _quartiles(after[~carriers]),
        "declared_group": "bottom" if entry.variant == "diffuse" else "top",
        "share_in_declared_group": float(in_group.mean()) if in_group.size else float("nan"),
        "evidence_b_t_mean": float(np.mean(token_b)) if token_b else float("nan"),
        "information_nats": planted_information(entry.ys, planted.labels, planted.tokens),
        "information_train_nats": planted_information(
            [y for y, t in zip(entry.ys, train, strict=True) if t], planted.labels[train],
            planted.tokens),
    }


def variant_table(entry: PlantedVariant, planted: Planted, xs: Rows, split: np.ndarray) -> Any:
    """The variant as a dataset table (``y``, ``x``, ``label``, ``group``, ``base_nll``,
    ``split``) for :func:`workers.datasets.table.canonicalize`: ``group`` says which rows carry
    evidence (per-group read-outs), ``base_nll`` the b_t kappa was recomputed from."""
    import pyarrow as pa

    return pa.table({
        "y": pa.array(entry.ys, pa.list_(pa.int64())),
        "x": pa.array([list(x) for x in xs], pa.list_(pa.int64())),
        "label": pa.array(planted.labels, pa.int64()),
        "group": [EVIDENCE_GROUP if c else PLAIN_GROUP for c in entry.carriers],
        "base_nll": pa.array([np.asarray(b, np.float32) for b in entry.base_after],
                             pa.list_(pa.float32())),
        "split": [SPLITS[int(s)] for s in split],
    })
