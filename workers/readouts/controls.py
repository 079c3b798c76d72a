"""Controls for the trivial explanations of a latent-recovery number (torch-free, sklearn).

A latent that "recovers" a label on real text may only have found its length or vocabulary.
Beside every NMI the study reports AMI and the NMI against shuffled labels
(:func:`workers.readouts.recovery.chance_readouts`), the test accuracy of a logistic regression
on the length alone and on token counts alone (beside the majority class), and, per group,
Spearman's rho between kappa and length (a 1/kappa reweighting may be a length reweighting).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence

import numpy as np
from scipy.stats import spearmanr
from sklearn.feature_extraction.text import CountVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler


def majority_accuracy(train_labels: Sequence[Hashable], test_labels: Sequence[Hashable]) -> float:
    """Test accuracy of always answering the train split's most frequent label."""
    top = Counter(train_labels).most_common(1)[0][0]
    return float(np.mean([label == top for label in test_labels]))


def _fit_score(model: object, train_x: object, train_y: Sequence[Hashable], test_x: object,
               test_y: Sequence[Hashable]) -> float:
    if len(set(train_y)) < 2:  # one class: the classifier is the majority answer
        return majority_accuracy(train_y, test_y)
    model.fit(train_x, np.asarray(train_y))  # type: ignore[attr-defined]
    return float(model.score(test_x, np.asarray(test_y)))  # type: ignore[attr-defined]


def length_only_accuracy(
    train_lengths: Sequence[int], train_labels: Sequence[Hashable],
    test_lengths: Sequence[int], test_labels: Sequence[Hashable],
) -> float:
    """Test accuracy of a logistic regression on (length, log length), trained on train."""
    def features(lengths: Sequence[int]) -> np.ndarray:
        n = np.asarray(lengths, dtype=float)[:, None]
        return np.hstack([n, np.log1p(n)])

    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
    return _fit_score(model, features(train_lengths), train_labels, features(test_lengths),
                      test_labels)


def bag_of_tokens_accuracy(
    train_tokens: Sequence[Sequence[Hashable]], train_labels: Sequence[Hashable],
    test_tokens: Sequence[Sequence[Hashable]], test_labels: Sequence[Hashable],
) -> float:
    """Test accuracy of a logistic regression on token counts (ids or words), trained on train.

    Tokens never seen in train carry no weight; an empty example is all zeros."""
    vectorizer = CountVectorizer(analyzer=lambda tokens: [str(t) for t in tokens])
    model = make_pipeline(vectorizer, LogisticRegression(max_iter=2000))
    return _fit_score(model, list(train_tokens), train_labels, list(test_tokens), test_labels)


def kappa_length_spearman(
    kappa: Sequence[float], lengths: Sequence[int], groups: Sequence[Hashable] | None = None,
) -> dict[str, float]:
    """Spearman's rho of kappa with length, per group (and ``"all"``).

    A group with fewer than 3 examples, or constant kappa or length, gives NaN.
    """
    k, n = np.asarray(kappa, dtype=float), np.asarray(lengths, dtype=float)
    g = np.asarray(["all"] * len(k) if groups is None else groups, dtype=object)
    out: dict[str, float] = {}
    for name in ["all", *sorted({str(x) for x in g} - {"all"})]:
        chosen = np.ones(len(k), bool) if name == "all" else np.array([str(x) == name for x in g])
        kk, nn = k[chosen], n[chosen]
        if len(kk) < 3 or np.ptp(kk) == 0 or np.ptp(nn) == 0:
            out[name] = math.nan
        else:
            out[name] = float(spearmanr(kk, nn).statistic)
    return out


def trivial_controls(
    tokens: Mapping[str, Sequence[Sequence[Hashable]]], labels: Mapping[str, Sequence[Hashable]],
) -> dict[str, float]:
    """Length-only, bag-of-tokens and majority test accuracies from ``train`` and ``test``
    splits (``tokens[split]``: one token sequence per example)."""
    lengths = {s: [len(t) for t in tokens[s]] for s in ("train", "test")}
    return {
        "majority_accuracy": majority_accuracy(labels["train"], labels["test"]),
        "length_only_accuracy": length_only_accuracy(lengths["train"], labels["train"],
                                                     lengths["test"], labels["test"]),
        "bag_of_tokens_accuracy": bag_of_tokens_accuracy(tokens["train"], labels["train"],
                                                         tokens["test"], labels["test"]),
    }
