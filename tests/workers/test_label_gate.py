"""The label gate's measures on labels whose answer is known: pure length, a give-away token,
pure formatting, a random label, a topic label, and evidence placed on the highest- or the
lowest-surprisal token."""

from __future__ import annotations

import math

import numpy as np
import pytest

from workers.readouts.label_gate import (
    FOR_STACKS,
    NOT_FOR_STACKS,
    GateSplit,
    ami_interval,
    classifier_accuracies,
    evidence_on_top_surprisal,
    kappa_against_evidence,
    nuisance_well_below,
    run_gate,
    verdict_and_flags,
    wilson,
)
from workers.readouts.text_features import content_words, shape_of


def letters(i: int) -> str:
    return chr(97 + i // 26) + chr(97 + i % 26)


FILLER = [f"word{letters(i)}" for i in range(60)]
TOPICS = {c: [f"{c}topic{letters(i)}" for i in range(30)] for c in ("red", "green", "blue", "gold")}


def make_split(texts: list[str], labels: list[str], b: list[np.ndarray] | None = None) -> GateSplit:
    vocab: dict[str, int] = {}
    tokens = [[vocab.setdefault(w, len(vocab)) for w in t.split()] for t in texts]
    return GateSplit(texts, tokens, labels, b)


def split_pair(make, n: int = 400, seed: int = 0) -> tuple[GateSplit, GateSplit]:
    """(train, test) from ``make(rng, i) -> (text, label)``, one shared vocabulary."""
    rng = np.random.default_rng(seed)
    rows = [make(rng, i) for i in range(2 * n)]
    both = make_split([t for t, _ in rows], [lab for _, lab in rows])
    cut = lambda s: GateSplit(both.texts[s], both.tokens[s], both.labels[s])  # noqa: E731
    return cut(slice(0, n)), cut(slice(n, 2 * n))


def words(rng, pool: list[str], n: int) -> str:
    return " ".join(rng.choice(pool, n))


def test_text_views_keep_one_kind_of_evidence() -> None:
    assert shape_of("Oak (Quercus alba), 1753.") == "C_(C_a),_0."
    assert shape_of("NASA's iPhone\n\tok") == "U'a_MN_a"
    assert content_words("The Oak is a TREE of 12 kinds; x y") == ["oak", "tree", "kinds"]


def test_wilson_and_ami_interval() -> None:
    low, high = wilson(50, 100)
    assert low == pytest.approx(0.4038, abs=1e-4) and high == pytest.approx(0.5962, abs=1e-4)
    assert wilson(0, 10)[0] == 0.0 and wilson(10, 10)[1] == 1.0
    truth = np.repeat([0, 1, 2], 50)
    assert ami_interval(truth, (truth + 1) % 3) == pytest.approx((1.0, 1.0, 1.0))


def test_pure_length_label_is_read_by_length_and_flagged() -> None:
    def make(rng, i):
        long = i % 2 == 1
        return words(rng, FILLER, int(rng.integers(14, 20) if long else rng.integers(3, 6))), \
            "long" if long else "short"

    result = run_gate(*split_pair(make))
    assert result["accuracy"]["length_only"]["accuracy"] > 0.97
    assert result["accuracy"]["content_words"]["accuracy"] < 0.8
    assert result["ceiling_ami"] < 0.3 and result["verdict"] == NOT_FOR_STACKS
    assert any(f.startswith("length:") for f in result["flags"])
    assert result["flags"][0].startswith("not for comparing stacks: the lower 95% bound of the "
                                         "ceiling AMI (tfidf_lsa_kmeans) is ")
    # length is in the length + formatting + frame reader: it reads the label, content does not
    assert result["accuracy"]["length_formatting_frame"]["accuracy"] > 0.97
    assert any("not well below the content words" in f for f in result["flags"])


def test_give_away_token_is_named() -> None:
    def make(rng, i):
        label = ("red", "green", "blue", "gold")[i % 4]
        return f"tag{label} " + words(rng, FILLER, int(rng.integers(5, 12))), label

    train, test = split_pair(make)
    result = run_gate(train, test, decode=lambda t: {v: k for k, v in zip(
        (w for t_ in train.texts + test.texts for w in t_.split()),
        (i for t_ in train.tokens + test.tokens for i in t_), strict=True)}.get(t, str(t)))
    assert result["accuracy"]["bag_of_tokens"]["accuracy"] == 1.0
    assert result["accuracy"]["majority"]["accuracy"] == pytest.approx(0.25)
    assert {k: v["text"] for k, v in result["single_tokens"].items()} == {
        c: f"tag{c}" for c in ("blue", "gold", "green", "red")}
    assert all(v["test_f1"] == 1.0 for v in result["single_tokens"].values())
    assert any(f.startswith("give-away tokens:") for f in result["flags"])


def test_formatting_label_is_read_by_formatting_only() -> None:
    def make(rng, i):
        shout = i % 2 == 0
        text = words(rng, FILLER, int(rng.integers(5, 10)))
        return (text.upper() + "!" if shout else text + "."), "shout" if shout else "plain"

    acc = run_gate(*split_pair(make))["accuracy"]
    assert acc["formatting_only"]["accuracy"] == 1.0
    assert acc["content_words"]["accuracy"] < 0.65  # the words are the same in both


def test_random_label_is_at_chance_and_not_for_stacks() -> None:
    def make(rng, i):
        topic = ("red", "green", "blue", "gold")[i % 4]
        return words(rng, TOPICS[topic], 8), str(rng.integers(0, 4))

    result = run_gate(*split_pair(make))
    for key in ("length_only", "formatting_only", "content_words", "bag_of_tokens"):
        assert result["accuracy"][key]["accuracy"] < 0.35, key  # 4 balanced classes: 0.25
    assert abs(result["unsupervised"]["tfidf_lsa_kmeans"]["ami"]) < 0.05
    assert result["verdict"] == NOT_FOR_STACKS


def test_topic_label_passes_the_gate() -> None:
    def make(rng, i):  # the topic in the body, a formulaic frame (two filler words each side)
        topic = ("red", "green", "blue", "gold")[i % 4]
        return " ".join([words(rng, FILLER[:3], 2), words(rng, TOPICS[topic] + FILLER[:5], 8),
                         words(rng, FILLER[3:6], 2)]), topic

    train, test = split_pair(make)
    states = tuple(np.eye(4)[[("red", "green", "blue", "gold").index(x) for x in s.labels]]
                   + np.random.default_rng(1).normal(0, 0.05, (len(s.labels), 4))
                   for s in (train, test))
    result = run_gate(train, test, states=states)
    assert result["unsupervised"]["tfidf_lsa_kmeans"]["ami"] > 0.9
    assert result["unsupervised"]["lm_states_kmeans"]["ami"] > 0.9
    assert result["verdict"] == FOR_STACKS and result["flags"] == []
    assert result["ceiling"]["low"] >= 0.3 and result["ceiling"]["reader"] == "tfidf_lsa_kmeans"
    assert result["accuracy"]["length_formatting_frame"]["accuracy"] < 0.4  # 4 classes: 0.25


def test_the_gate_reads_the_lower_bound_and_the_nuisance_reader() -> None:
    def accuracy(**values: float) -> dict[str, dict[str, float]]:
        return {k: {"accuracy": v} for k, v in values.items()}

    # "well below": the nuisance reader's gain over the majority at most half the content words'
    assert nuisance_well_below(accuracy(majority=0.25, content_words=0.85,
                                        length_formatting_frame=0.54))
    assert not nuisance_well_below(accuracy(majority=0.25, content_words=0.85,
                                            length_formatting_frame=0.56))
    base = {"unsupervised": {}, "single_tokens": {}, "accuracy": accuracy(
        majority=0.25, content_words=0.85, length_formatting_frame=0.3, length_only=0.25,
        formatting_only=0.25, bag_of_tokens=0.85)}
    # a point estimate above 0.3 whose lower bound is below it does not pass
    low = {"reader": "tfidf_lsa_kmeans", "ami": 0.35, "low": 0.29, "high": 0.41}
    verdict, flags = verdict_and_flags({**base, "ceiling": low})
    assert verdict == NOT_FOR_STACKS and "is 0.290 < 0.3 (point 0.350)" in flags[0]
    assert verdict_and_flags({**base, "ceiling": {**low, "low": 0.3}}) == (FOR_STACKS, [])


@pytest.mark.parametrize(("on_top", "classes"), [(True, 4), (False, 4), (True, 2)])
def test_evidence_share_follows_the_surprisal_of_the_evidence(on_top: bool, classes: int) -> None:
    rng = np.random.default_rng(0)
    texts, labels, bs = [], [], []
    names = ("red", "green", "blue", "gold")[:classes]
    for i in range(800):
        label = names[i % classes]
        body = list(rng.choice(FILLER, 9))
        texts.append(" ".join([f"tag{label}", *body]))
        labels.append(label)
        b = rng.uniform(2.0, 4.0, 10)
        b[0] = 9.0 if on_top else 0.1  # the label's token: the most or the least surprising
        bs.append(b)
    both = make_split(texts, labels, bs)
    train = GateSplit(both.texts[:400], both.tokens[:400], both.labels[:400], bs[:400])
    test = GateSplit(both.texts[400:], both.tokens[400:], both.labels[400:], bs[400:])
    _, model = classifier_accuracies(train, test)
    evidence = evidence_on_top_surprisal(model, test)
    assert evidence["null_share"] == pytest.approx(0.1) and evidence["examples"] == 400
    assert evidence["low"] <= evidence["share"] <= evidence["high"]
    if on_top:
        assert evidence["share"] > 0.5 and evidence["excess"] > 0.4
    else:
        assert evidence["share"] < 0.1 and evidence["excess"] < 0
    assert set(evidence["per_label"]) == set(names)
    assert not math.isnan(evidence["per_label"]["red"]["share"])


@pytest.mark.parametrize("concentrated_carry_the_label", [True, False])
def test_kappa_against_evidence_says_whether_the_concentrated_examples_carry_the_label(
        concentrated_carry_the_label: bool) -> None:
    """Half the examples name their label (a tag token), half do not; the tagged half has
    concentrated surprisal (one spike: high kappa) or flat surprisal (kappa about 1)."""
    rng = np.random.default_rng(0)
    texts, labels, kappas = [], [], []
    names = ("red", "green")
    for i in range(800):
        label, tagged = names[i % 2], (i // 2) % 2 == 0
        body = list(rng.choice(FILLER, 9))
        texts.append(" ".join([f"tag{label}" if tagged else str(rng.choice(FILLER)), *body]))
        labels.append(label)
        spike = tagged == concentrated_carry_the_label
        kappas.append(rng.uniform(3.0, 4.0) if spike else rng.uniform(1.0, 1.2))
    both = make_split(texts, labels)
    kappa = np.asarray(kappas)
    train = GateSplit(both.texts[:400], both.tokens[:400], both.labels[:400], kappa={1.0: kappa[:400]})
    test = GateSplit(both.texts[400:], both.tokens[400:], both.labels[400:], kappa={1.0: kappa[400:]})
    _, model = classifier_accuracies(train, test)
    found = kappa_against_evidence(model, test)["alpha_1"]
    assert found["examples"] == 400
    sign = 1 if concentrated_carry_the_label else -1
    assert sign * found["spearman"] > 0.5 and sign * found["given_length"] > 0.5
