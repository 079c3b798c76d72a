"""The trivial-explanation controls on cases whose answers are known."""

from __future__ import annotations

import math

import numpy as np
import pytest

from workers.readouts.controls import (
    bag_of_tokens_accuracy,
    kappa_length_spearman,
    length_only_accuracy,
    majority_accuracy,
    trivial_controls,
)
from workers.readouts.recovery import chance_readouts, latent_recovery


def test_perfect_clustering_has_ami_one_and_low_chance() -> None:
    labels = np.array([0, 1, 2] * 100)
    relabelled = np.array([2, 0, 1])[labels]
    got = chance_readouts(relabelled, labels)
    assert latent_recovery(relabelled, labels)["latent_nmi"] == pytest.approx(1.0)
    assert got["latent_ami"] == pytest.approx(1.0) and got["latent_nmi_shuffled"] < 0.05


def test_many_clusters_on_noise_inflate_nmi_but_not_ami() -> None:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 200)
    noise = rng.integers(0, 50, 200)  # 50 clusters unrelated to the labels
    nmi = latent_recovery(noise, labels)["latent_nmi"]
    got = chance_readouts(noise, labels, shuffles=50)
    assert nmi > 0.03  # NMI rewards fragmentation...
    assert abs(got["latent_ami"]) < 0.05  # ...AMI does not
    assert got["latent_nmi_shuffled"] == pytest.approx(nmi, abs=0.05)  # and chance says so


def test_length_only_classifier_finds_length_and_only_length() -> None:
    rng = np.random.default_rng(1)
    n = rng.integers(5, 60, 400)
    by_length = (n > 30).astype(int)
    assert length_only_accuracy(n[:300], by_length[:300], n[300:], by_length[300:]) > 0.95
    unrelated = rng.integers(0, 2, 400)
    acc = length_only_accuracy(n[:300], unrelated[:300], n[300:], unrelated[300:])
    assert 0.35 < acc < 0.65


def test_bag_of_tokens_classifier_finds_a_marker_token() -> None:
    rng = np.random.default_rng(2)
    labels = rng.integers(0, 2, 300)
    tokens = [[*rng.integers(10, 100, 8).tolist(), 1 if y else 2] for y in labels]
    assert bag_of_tokens_accuracy(tokens[:200], labels[:200], tokens[200:], labels[200:]) == 1.0
    shuffled = rng.permutation(labels)
    acc = bag_of_tokens_accuracy(tokens[:200], shuffled[:200], tokens[200:], shuffled[200:])
    assert acc < 0.7


def test_majority_and_one_class_train() -> None:
    assert majority_accuracy(["a", "a", "b"], ["a", "b", "b", "b"]) == 0.25
    assert length_only_accuracy([1, 2], ["a", "a"], [3, 4], ["a", "b"]) == 0.5


def test_kappa_length_spearman_per_group() -> None:
    lengths = [1, 2, 3, 4, 1, 2, 3, 4, 5, 5]
    kappa = [1.0, 1.1, 1.2, 1.3, 2.0, 1.9, 1.8, 1.7, 1.0, 1.0]
    groups = ["up"] * 4 + ["down"] * 4 + ["flat"] * 2
    got = kappa_length_spearman(kappa, lengths, groups)
    assert got["up"] == pytest.approx(1.0) and got["down"] == pytest.approx(-1.0)
    assert math.isnan(got["flat"])  # two examples, constant kappa
    assert set(got) == {"all", "up", "down", "flat"}
    assert kappa_length_spearman([1, 2, 3], [3, 4, 5])["all"] == pytest.approx(1.0)


def test_trivial_controls_bundle() -> None:
    tokens = {"train": [[1, 5], [2, 5, 5, 5]] * 20, "test": [[1, 5], [2, 5, 5, 5]] * 5}
    labels = {"train": ["x", "y"] * 20, "test": ["x", "y"] * 5}
    got = trivial_controls(tokens, labels)
    assert got["majority_accuracy"] == 0.5
    assert got["length_only_accuracy"] == 1.0 and got["bag_of_tokens_accuracy"] == 1.0
