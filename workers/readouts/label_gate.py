"""The label gate: can a latent find this label at all, and what else gives it away?

Torch-free, scikit-learn; ``scripts/label_gate.py`` runs it on a registered dataset. Fitted on
the train split and scored on test: the unsupervised ceiling (a label no clustering finds is not
for comparing stacks), what a supervised reader gets from one kind of evidence (length,
formatting, content words, all tokens), kappa against length, and where the evidence sits
against surprisal (:func:`run_gate` lists each part).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.stats import rankdata
from sklearn.cluster import KMeans
from sklearn.decomposition import PCA, TruncatedSVD
from sklearn.feature_extraction.text import CountVectorizer
from sklearn.linear_model import LogisticRegression, LogisticRegressionCV
from sklearn.metrics import adjusted_mutual_info_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import Normalizer, StandardScaler

from workers.readouts.controls import kappa_length_spearman, length_only_accuracy
from workers.readouts.text_features import (
    NuisanceVectorizer,
    content_vectorizer,
    formatting_vectorizer,
    lsa_vectorizer,
)

CEILING_AMI_MIN = 0.3  # on the lower 95% bound of the gating reader's ceiling
GATING_READER = "tfidf_lsa_kmeans"  # a reader the encoder can match (the LM states' is shown beside)
# "Well below": the length + formatting + frame reader's gain over the majority class is at most
# this share of the content-words reader's gain.
NUISANCE_SHARE_MAX = 0.5
NOT_FOR_STACKS = "not for comparing stacks"
FOR_STACKS = "usable for comparing stacks"
BOOTSTRAP = 200
TOP_FRACTION = 0.1
# Short texts give k-means many local optima of near-equal inertia: many restarts, the lowest
# inertia kept (an unsupervised choice), so the ceiling does not hang on one seed.
KMEANS_RESTARTS = 50
NO_WORDS = "no content words in the train split: the majority answer"


@dataclass(frozen=True)
class GateSplit:
    """One split's examples: text, token ids, labels, and optionally b_t per token and
    kappa_alpha per example (``{alpha: array}``)."""

    texts: Sequence[str]
    tokens: Sequence[Sequence[int]]
    labels: Sequence[Hashable]
    surprisal: Sequence[np.ndarray] | None = None
    kappa: dict[float, np.ndarray] = field(default_factory=dict)


def ami_interval(truth: Sequence[Hashable], found: np.ndarray, seed: int = 0,
                 resamples: int = BOOTSTRAP) -> tuple[float, float, float]:
    """(AMI, 2.5th and 97.5th percentile of a bootstrap over the rows)."""
    truth_arr, found = np.asarray(truth), np.asarray(found)
    rng = np.random.default_rng(seed)
    draws = [adjusted_mutual_info_score(truth_arr[i], found[i])
             for i in (rng.integers(0, len(found), len(found)) for _ in range(resamples))]
    low, high = np.quantile(draws, [0.025, 0.975])
    return float(adjusted_mutual_info_score(truth_arr, found)), float(low), float(high)


def kmeans_ceiling(train: np.ndarray | Any, test: np.ndarray | Any, test_labels: Sequence[Hashable],
                   k: int, seed: int = 0) -> dict[str, float]:
    """k-means (:data:`KMEANS_RESTARTS` restarts) fitted on ``train`` features (already
    reduced), test rows assigned to the nearest centre; test AMI with its bootstrap interval."""
    model = KMeans(n_clusters=k, n_init=KMEANS_RESTARTS, random_state=seed).fit(train)
    ami, low, high = ami_interval(test_labels, model.predict(test), seed)
    return {"ami": ami, "low": low, "high": high}


def tfidf_lsa_ceiling(train_texts: Sequence[str], test_texts: Sequence[str],
                      test_labels: Sequence[Hashable], k: int, dims: int = 100,
                      seed: int = 0) -> dict[str, float]:
    """k-means on TF-IDF (content words) reduced by LSA (``dims`` components), l2-normalised.
    Text without a content word seen twice in train gives one cluster (AMI 0, noted)."""
    try:
        tfidf = lsa_vectorizer().fit(train_texts)
    except ValueError:  # sklearn's "empty vocabulary"
        return {"ami": 0.0, "low": 0.0, "high": 0.0, "note": NO_WORDS}
    train_x = tfidf.transform(train_texts)
    components = min(dims, train_x.shape[1] - 1)
    reduce = (make_pipeline(TruncatedSVD(components, random_state=seed), Normalizer())
              if components >= 2 else Normalizer())  # too few words to reduce
    return kmeans_ceiling(reduce.fit_transform(train_x), reduce.transform(tfidf.transform(test_texts)),
                          test_labels, k, seed)


def states_ceiling(train_states: np.ndarray, test_states: np.ndarray,
                   test_labels: Sequence[Hashable], k: int, dims: int = 50,
                   seed: int = 0) -> dict[str, float]:
    """k-means on mean hidden states, standardised per dimension (a few dimensions of a
    transformer's states are orders of magnitude larger than the rest), PCA, l2-normalised."""
    reduce = make_pipeline(StandardScaler(), PCA(min(dims, *train_states.shape), random_state=seed),
                           Normalizer())
    return kmeans_ceiling(reduce.fit_transform(train_states), reduce.transform(test_states),
                          test_labels, k, seed)


def wilson(correct: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a proportion (within [0, 1])."""
    if n == 0:
        return math.nan, math.nan
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _accuracy(predicted: Sequence[Hashable], truth: Sequence[Hashable]) -> dict[str, float]:
    correct = int(sum(p == t for p, t in zip(predicted, truth, strict=True)))
    low, high = wilson(correct, len(truth))
    return {"accuracy": correct / len(truth), "low": low, "high": high}


def _classifier(vectorizer: Any, select_c: bool) -> Any:
    """A logistic regression on ``vectorizer``'s features; with ``select_c`` its inverse
    penalty C chosen among 1, 10, 100 by 3-fold cross-validation on the train split (the
    proportion views' entries are small: at C = 1 they underfit)."""
    if not select_c:
        return make_pipeline(vectorizer, LogisticRegression(max_iter=3000))
    return make_pipeline(vectorizer, LogisticRegressionCV(
        Cs=(1.0, 10.0, 100.0), cv=3, max_iter=3000, scoring="accuracy", l1_ratios=(0.0,),
        use_legacy_attributes=False))


def _tokens_analyzer(tokens: Sequence[int]) -> list[str]:
    return [str(t) for t in tokens]


def classifier_accuracies(train: GateSplit, test: GateSplit) -> tuple[dict[str, dict], Any]:
    """Test accuracy of each one-evidence classifier (module doc) and the fitted
    bag-of-tokens pipeline (for :func:`evidence_on_top_surprisal`).

    Length: (n, log n) of the token count (:func:`workers.readouts.controls.length_only_accuracy`).
    Formatting and content words: proportions (:mod:`workers.readouts.text_features`), C chosen
    on train. Bag of tokens: raw token counts at C = 1, as the study's controls have it.
    Length + formatting + frame: all the evidence but the content at once
    (:class:`~workers.readouts.text_features.NuisanceVectorizer`), C chosen on train.
    """
    majority = Counter(train.labels).most_common(1)[0][0]
    out = {"majority": _accuracy([majority] * len(test.labels), test.labels)}
    lengths = [len(t) for t in train.tokens], [len(t) for t in test.tokens]
    acc = length_only_accuracy(lengths[0], list(train.labels), lengths[1], list(test.labels))
    out["length_only"] = {"accuracy": acc, **dict(zip(("low", "high"), wilson(
        round(acc * len(test.labels)), len(test.labels)), strict=True))}
    models = {}
    pairs = [list(zip(split.texts, split.tokens, strict=True)) for split in (train, test)]
    for name, vectorizer, train_x, test_x in (
            ("formatting_only", formatting_vectorizer(), train.texts, test.texts),
            ("content_words", content_vectorizer(), train.texts, test.texts),
            ("bag_of_tokens", CountVectorizer(analyzer=_tokens_analyzer), train.tokens, test.tokens),
            ("length_formatting_frame", NuisanceVectorizer(), *pairs)):
        try:
            models[name] = _classifier(vectorizer, name != "bag_of_tokens").fit(
                list(train_x), np.asarray(train.labels))
        except ValueError:  # sklearn's "empty vocabulary": nothing of this kind to read
            out[name] = {**out["majority"], "note": NO_WORDS}
            continue
        out[name] = _accuracy(models[name].predict(list(test_x)).tolist(), list(test.labels))
    return out, models["bag_of_tokens"]


def best_single_tokens(train: GateSplit, test: GateSplit,
                       decode: Callable[[int], str] | None = None) -> dict[str, dict]:
    """Per label, the token whose presence best marks it on train (F1 of "token present =>
    this label"), and that rule's test F1. A label with a test F1 near 1 is given away by one
    token."""
    vectorizer = CountVectorizer(analyzer=_tokens_analyzer, binary=True).fit(list(train.tokens))
    x_train = vectorizer.transform(list(train.tokens)).tocsc()
    x_test = vectorizer.transform(list(test.tokens)).tocsc()
    names = vectorizer.get_feature_names_out()
    y_train, y_test = np.asarray(train.labels), np.asarray(test.labels)
    out: dict[str, dict] = {}
    for label in sorted(set(train.labels), key=str):
        mine = y_train == label
        tp = np.asarray(x_train[mine].sum(axis=0)).ravel()
        fp = np.asarray(x_train[~mine].sum(axis=0)).ravel()
        j = int(np.argmax(2 * tp / (2 * tp + fp + (mine.sum() - tp))))
        present = x_test[:, j].toarray().ravel() > 0
        hit = y_test == label
        f1 = 2 * (present & hit).sum() / max(1, present.sum() + hit.sum())
        token = int(names[j])
        out[str(label)] = {"token": token, "text": decode(token) if decode else str(token),
                           "test_f1": float(f1)}
    return out


def evidence_on_top_surprisal(model: Any, test: GateSplit,
                              top_fraction: float = TOP_FRACTION) -> dict[str, Any]:
    """Where the bag-of-tokens classifier's evidence for the true class sits.

    Per test example: e_t = |coef[true class, token t]| for each token occurrence (0 for a
    token never seen in train); the top set is the ceil(``top_fraction`` x n) tokens with the
    highest b_t; share = sum of e over the top set / sum of e. The null share is the top set's
    size / n (what any set of that size holds on average when evidence is blind to b_t).
    Examples with no evidence at all are left out (counted). Means over examples, overall and
    per label, with 95% normal intervals (clipped to [0, 1]).
    """
    if test.surprisal is None:
        raise ValueError("evidence_on_top_surprisal needs test.surprisal (b_t per token)")
    vectorizer, classifier = model.steps[0][1], model.steps[-1][1]
    vocab = vectorizer.vocabulary_
    row_of = {label: i for i, label in enumerate(classifier.classes_.tolist())}
    coefs = classifier.coef_
    if coefs.shape[0] == 1:  # two classes: one row, for classes_[1]; classes_[0]'s is its negative
        coefs = np.vstack([-coefs[0], coefs[0]])
    shares, nulls, labels, empty = [], [], [], 0
    for tokens, b, label in zip(test.tokens, test.surprisal, test.labels, strict=True):
        coef = coefs[row_of[label]] if label in row_of else None
        evidence = np.array([abs(coef[vocab[str(t)]]) if coef is not None and str(t) in vocab
                             else 0.0 for t in tokens])
        if evidence.sum() <= 0:
            empty += 1
            continue
        top = max(1, math.ceil(top_fraction * len(tokens)))
        chosen = np.argsort(-np.asarray(b, dtype=float), kind="stable")[:top]
        shares.append(evidence[chosen].sum() / evidence.sum())
        nulls.append(top / len(tokens))
        labels.append(label)

    def summary(mask: np.ndarray) -> dict[str, float]:
        s, n = np.asarray(shares)[mask], np.asarray(nulls)[mask]
        half = 1.96 * s.std(ddof=1) / math.sqrt(len(s)) if len(s) > 1 else math.nan
        return {"share": float(s.mean()), "low": max(0.0, float(s.mean() - half)),
                "high": min(1.0, float(s.mean() + half)), "null_share": float(n.mean()),
                "excess": float(s.mean() - n.mean()), "examples": int(len(s))}

    labels_arr = np.asarray(labels, dtype=object)
    return {"top_fraction": top_fraction, "examples_without_evidence": empty,
            **summary(np.ones(len(shares), bool)),
            "per_label": {str(lab): summary(labels_arr == lab)
                          for lab in sorted(set(labels), key=str)}}


def kappa_against_evidence(model: Any, test: GateSplit) -> dict[str, dict[str, float]]:
    """Do the concentrated examples carry more of the label? Per alpha, Spearman's rho of each
    test example's kappa_alpha with the bag-of-tokens classifier's margin for its true class
    (log p(true) minus the largest other log p), and the same with length partialled out (both
    ranked, then the residuals of a least-squares fit on the length's rank correlated).

    The caveat's side: R~ divides each example by its kappa, so where the concentrated examples
    are the ones that carry the label (rho > 0), R~ turns the latent's pressure away from them
    (predicted R~ - R_tok < 0); where they carry less (rho < 0), towards the rest (> 0).
    """
    if not test.kappa:
        raise ValueError("kappa_against_evidence needs test.kappa (kappa_alpha per example)")
    log_probs = model.predict_log_proba(list(test.tokens))
    classes = model.steps[-1][1].classes_.tolist()
    rows = [classes.index(label) if label in classes else -1 for label in test.labels]
    margin = np.array([lp[r] - np.max(np.delete(lp, r)) if r >= 0 else math.nan
                       for lp, r in zip(log_probs, rows, strict=True)])
    length = np.array([len(tokens) for tokens in test.tokens], dtype=float)
    known = np.isfinite(margin)

    def ranks(values: np.ndarray) -> np.ndarray:
        return rankdata(values[known])

    def residual(values: np.ndarray) -> np.ndarray:
        x = np.column_stack([np.ones(known.sum()), ranks(length)])
        return values - x @ np.linalg.lstsq(x, values, rcond=None)[0]

    out = {}
    for alpha, kappa in sorted(test.kappa.items()):
        k, m = ranks(np.asarray(kappa, dtype=float)), ranks(margin)
        out[f"alpha_{alpha:g}"] = {"spearman": float(np.corrcoef(k, m)[0, 1]),
                                   "given_length": float(np.corrcoef(residual(k), residual(m))[0, 1]),
                                   "examples": int(known.sum())}
    return out


def nuisance_well_below(accuracy: dict[str, dict[str, float]]) -> bool:
    """Whether the length + formatting + frame reader stays well below the content reader: its
    gain over the majority class at most :data:`NUISANCE_SHARE_MAX` of the content words'."""
    floor = accuracy["majority"]["accuracy"]
    nuisance = accuracy["length_formatting_frame"]["accuracy"] - floor
    return nuisance <= NUISANCE_SHARE_MAX * (accuracy["content_words"]["accuracy"] - floor)


def verdict_and_flags(result: dict[str, Any]) -> tuple[str, list[str]]:
    """The gate's verdict and its warnings. Usable for comparing stacks only when the lower 95%
    bound of the gating reader's ceiling reaches :data:`CEILING_AMI_MIN` and the length +
    formatting + frame reader stays well below the content words (:func:`nuisance_well_below`)."""
    flags = []
    ceiling = result["ceiling"]
    passed = ceiling["low"] >= CEILING_AMI_MIN
    if not passed:
        flags.append(f"{NOT_FOR_STACKS}: the lower 95% bound of the ceiling AMI ({ceiling['reader']}) "
                     f"is {ceiling['low']:.3f} < {CEILING_AMI_MIN} (point {ceiling['ami']:.3f})")
    acc = {k: v["accuracy"] for k, v in result["accuracy"].items()}
    floor = acc["majority"]
    if not nuisance_well_below(result["accuracy"]):
        passed = False
        flags.append(f"{NOT_FOR_STACKS}: length + formatting + frame reads "
                     f"{acc['length_formatting_frame']:.2f}, not well below the content words "
                     f"({acc['content_words']:.2f}; majority {floor:.2f}: its gain must be at most "
                     f"{NUISANCE_SHARE_MAX:g} of theirs)")
    best = max(acc["content_words"], acc["bag_of_tokens"], acc["formatting_only"])
    if acc["length_only"] - floor > 0.1 and acc["length_only"] - floor >= 0.5 * (best - floor):
        flags.append(f"length: length alone reaches {acc['length_only']:.2f} (majority "
                     f"{floor:.2f}, best reader {best:.2f})")
    if acc["formatting_only"] - floor > 0.1 and acc["formatting_only"] >= acc["content_words"]:
        flags.append(f"formatting: formatting alone ({acc['formatting_only']:.2f}) reads the "
                     f"label as well as the content words ({acc['content_words']:.2f})")
    given = {k: v for k, v in result.get("single_tokens", {}).items() if v["test_f1"] >= 0.9}
    if given:
        flags.append("give-away tokens: " + ", ".join(
            f"{k} by {v['text']!r} (F1 {v['test_f1']:.2f})" for k, v in given.items()))
    return (FOR_STACKS if passed else NOT_FOR_STACKS), flags


def run_gate(train: GateSplit, test: GateSplit, *,
             states: tuple[np.ndarray, np.ndarray] | None = None,
             decode: Callable[[int], str] | None = None, seed: int = 0) -> dict[str, Any]:
    """Every measure of the gate, as JSON-ready data (``verdict`` and ``flags`` last).

    Everything is fitted on the train split and scored on the test split:

    - **the unsupervised ceiling**: k-means (k = the number of labels) on the text's TF-IDF
      reduced by LSA, and on the base model's mean hidden states where there is one; test AMI
      against the label, with a bootstrap interval. The gate reads the TF-IDF/LSA ceiling (a
      reader the CVAE's encoder can match; the LM states' is shown beside, not gating) at the
      lower end of its interval: under :data:`CEILING_AMI_MIN` the label is *not for comparing
      stacks*: a latent that worked perfectly would still read near chance.
    - **everything but the content**: a reader of length + formatting + the first and last
      tokens at once must stay well below the content words (:func:`nuisance_well_below`), or
      the label is not for comparing stacks either.
    - **what a supervised reader gets from one kind of evidence**: logistic regressions on the
      length alone, the formatting alone, the content words alone and all the tokens, beside the
      majority class (test accuracy, Wilson intervals); the best single token per label.
    - **kappa against length**: Spearman's rho of kappa_alpha (given, per example) with the length.
    - **where the evidence sits** (:func:`evidence_on_top_surprisal`): the share of the
      bag-of-tokens classifier's evidence for the true class on each example's highest-surprisal
      tokens, against the share the same number of tokens would hold at random; and whether the
      concentrated examples carry more of it (:func:`kappa_against_evidence`: kappa against the
      classifier's margin), the caveat's side.

    Args:
        train, test: the splits (fit on train, score on test).
        states: mean hidden states of the base model for (train rows, test rows); the train
            rows may be a subsample (k-means is unsupervised: no train labels are read).
        decode: token id -> its text, for naming give-away tokens.
    """
    k = len(set(train.labels) | set(test.labels))
    ceilings = {"tfidf_lsa_kmeans": tfidf_lsa_ceiling(train.texts, test.texts, test.labels, k,
                                                      seed=seed)}
    if states is not None:
        ceilings["lm_states_kmeans"] = states_ceiling(*states, test.labels, k, seed=seed)
    accuracy, tokens_model = classifier_accuracies(train, test)
    result: dict[str, Any] = {
        "rows": {"train": len(train.labels), "test": len(test.labels)},
        "labels": dict(sorted(Counter(map(str, test.labels)).items())), "k": k,
        "unsupervised": ceilings,
        "ceiling": {"reader": GATING_READER, **ceilings[GATING_READER],
                    "bound": f"bootstrap over the test rows ({BOOTSTRAP} resamples), k-means fitted once"},
        "ceiling_ami": ceilings[GATING_READER]["ami"],
        "accuracy": accuracy, "single_tokens": best_single_tokens(train, test, decode),
    }
    if train.kappa:
        labels = [*map(str, train.labels), *map(str, test.labels)]
        lengths = [*map(len, train.tokens), *map(len, test.tokens)]
        result["kappa_length_spearman"] = {
            f"alpha_{alpha:g}": kappa_length_spearman(
                np.concatenate([train.kappa[alpha], test.kappa[alpha]]), lengths, labels)
            for alpha in sorted(train.kappa)}
    if test.surprisal is not None:
        result["evidence_on_top_surprisal"] = evidence_on_top_surprisal(tokens_model, test)
    if test.kappa:
        result["kappa_against_evidence"] = kappa_against_evidence(tokens_model, test)
    result["verdict"], result["flags"] = verdict_and_flags(result)
    return result
