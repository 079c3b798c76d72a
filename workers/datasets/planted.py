"""A planted positive control: a registered dataset with a label whose evidence sits where we say.

The caveat of R~ (each example divided by its kappa_alpha) predicts R~ - R_tok < 0 when a
label's evidence sits in the concentrated (high-kappa) examples and > 0 when it sits in the
diffuse (low-kappa) ones. On real text nobody knows where a label's evidence sits; here it is
planted. From a source dataset's rows (their ``y`` ids, ``x`` and split):

1. a random **label**, 0 or 1, balanced within every split (seeded);
2. two **evidence tokens** (by default the two smallest ids that occur nowhere in the source,
   so they carry the planted label and nothing else), and **every** row gets one of them, once, at a seeded place in ``y`` (start,
   end or random; the same place in every variant);
3. the **carriers**, ``fraction`` of each (split, label) cell, get the token of their label;
   every other row gets one at random (half of each cell's other rows each), which says nothing
   about its label. The carriers are chosen among the rows by their kappa_alpha *after*
   planting: the highest (``concentrated``), the lowest (``diffuse``) or at random (``null``).

Every row receives the same kind of token at the same place in all three variants, so planting
shifts every row's kappa alike and the carriers stay in the group they were chosen from (a
token written into the carriers only would raise their kappa and push a "diffuse" carrier out
of the bottom group). The labels, positions, tokens and the counts of (label, token) are the
same in the three variants: the information planted is matched by construction, I(label;
token) = log 2 - H_b((1 + fraction) / 2) nats where the tokens occur nowhere else, and measured
all the same (:func:`planted_information`). The base is re-fitted on each variant's own rows and
kappa recomputed, so what is shown is what a sweep with ``base.kind: precomputed`` on the variant
trains on (its ``base_nll`` column holds these b_t). Torch-free: the base is a callable
(:data:`Base`); :func:`unigram_base` is the default.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

VARIANTS: tuple[str, ...] = ("concentrated", "diffuse", "null")
SPLIT_NAMES: tuple[str, ...] = ("train", "val", "test")
EVIDENCE_GROUP, PLAIN_GROUP = "evidence", "none"

Rows = Sequence[Sequence[int]]
Scorer = Callable[[Rows, Rows], list[np.ndarray]]
Base = Callable[[Rows, Rows, np.ndarray], Scorer]
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


def _token_choice(carriers: np.ndarray, split: np.ndarray, labels: np.ndarray,
                  rng: np.random.Generator, seed: int) -> np.ndarray:
    """Which evidence token (0 or 1) each row gets: its label's for a carrier; for the other
    rows of each (split, label) cell, half one and half the other, so the token says nothing
    about their label. An odd cell's extra row gets the token of a coin seeded by the cell,
    the same in every variant: the (label, token) counts are then equal across variants."""
    choice = np.where(carriers, labels, 0)
    for index in np.unique(split):
        for label in (0, 1):
            rows = rng.permutation(np.flatnonzero((split == index) & (labels == label) & ~carriers))
            coin = np.random.default_rng([seed, int(index), label]).random() < 0.5
            choice[rows[:len(rows) // 2 + int(coin) * (len(rows) % 2)]] = 1
    return choice


def _written(ys: Rows, positions: np.ndarray, tokens: tuple[int, int],
             choice: np.ndarray) -> list[list[int]]:
    return [[*y[:p], tokens[c], *y[p:]] for y, p, c in zip(ys, positions, choice, strict=True)]


def plant(xs: Rows, ys: Rows, split: np.ndarray, *, alpha: float = 1.0, fraction: float = 0.25,
          seed: int = 0, tokens: tuple[int, int] | None = None,
          position: Literal["start", "end", "random"] = "random",
          base: Base = unigram_base) -> Planted:
    """The three variants of the module doc from a source's rows.

    Args:
        xs, ys: the source's contexts and targets (ids), one list per row.
        split: 0 train, 1 val, 2 test per row.
        alpha: the kappa_alpha that chooses the carriers and is reported.
        fraction: the share of each (split, label) cell that carries evidence, in (0, 0.5].
        tokens: the evidence ids of label 0 and label 1 (default :func:`absent_tokens`).
        position: where the evidence token goes in ``y``.
        base: fits b_t on a dataset's rows (default: a unigram of the train split).

    Raises:
        ValueError: a fraction outside (0, 0.5], equal tokens, or a split of fewer than 4 rows.
    """
    if not 0 < fraction <= 0.5:
        raise ValueError(f"fraction {fraction} must be in (0, 0.5]: the carriers are the top or "
                         "bottom group of each cell, never more than half of it")
    split = np.asarray(split)
    for index, name in enumerate(SPLIT_NAMES):
        if 0 < (split == index).sum() < 4:
            raise ValueError(f"split {name!r} has {(split == index).sum()} rows: a planted control "
                             "needs at least 4 per split (2 per label)")
    tokens = tokens or absent_tokens(ys)
    if tokens[0] == tokens[1]:
        raise ValueError(f"the two evidence tokens are both {tokens[0]}: give two different ids")
    labels = balanced_labels(split, seed)
    positions = insert_positions(ys, position, seed)
    kappa_before = kappa(base(xs, ys, split)(xs, ys), alpha)
    rng = np.random.default_rng(seed + 2)
    null = _choose(np.zeros(len(ys)), split, labels, fraction, "null", rng)
    null_rows = _written(ys, positions, tokens, _token_choice(null, split, labels, rng, seed))
    # Ranked as carriers, with their label's token, under the base of a planted dataset (a
    # unigram's counts of the two tokens are the same in every variant: balanced in every cell).
    kappa_candidate = kappa(base(xs, null_rows, split)(xs, _written(ys, positions, tokens, labels)),
                            alpha)
    variants = {}
    for variant in VARIANTS:
        if variant == "null":
            carriers, rows = null, null_rows
        else:
            carriers = _choose(kappa_candidate, split, labels, fraction, variant, rng)
            rows = _written(ys, positions, tokens, _token_choice(carriers, split, labels, rng, seed))
        after = base(xs, rows, split)(xs, rows)  # re-fitted on this variant's own rows
        variants[variant] = PlantedVariant(variant, rows, carriers, after, kappa_before,
                                           kappa(after, alpha))
    config = {"alpha": alpha, "fraction": fraction, "seed": seed, "tokens": list(tokens),
              "position": position}
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
        "rows_planted": {name: int((carriers & (split == i)).sum()) for i, name in enumerate(SPLIT_NAMES)},
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
        "split": [SPLIT_NAMES[int(s)] for s in split],
    })
