"""Tests for the latent recovery read-outs (workers/readouts/recovery.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from workers.readouts.recovery import (
    active_units_discrete,
    active_units_gaussian,
    discrete_mutual_information,
    gaussian_mutual_information,
    kmeans_labels,
    latent_recovery,
    used_categories,
)


class TestLatentRecovery:
    def test_perfect_recovery_up_to_permutation(self):
        truth = torch.tensor([0, 0, 1, 1, 2, 2, 2])
        permuted = torch.tensor([2, 0, 1])[truth]
        scores = latent_recovery(permuted, truth)
        assert set(scores) == {"latent_nmi", "latent_ari"}
        assert scores["latent_nmi"] == pytest.approx(1.0)
        assert scores["latent_ari"] == pytest.approx(1.0)

    def test_accepts_numpy_arrays(self):
        labels = np.array([1, 1, 0, 0])
        assert latent_recovery(labels, labels)["latent_ari"] == pytest.approx(1.0)

    def test_independent_labels_score_near_zero(self):
        rng = np.random.default_rng(0)
        inferred = rng.integers(0, 4, size=5000)
        truth = rng.integers(0, 4, size=5000)
        scores = latent_recovery(inferred, truth)
        assert scores["latent_nmi"] < 0.01
        assert abs(scores["latent_ari"]) < 0.01

    @pytest.mark.parametrize("empty_arg", ["inferred", "truth"])
    def test_empty_input_names_the_argument(self, empty_arg):
        arguments = {"inferred": torch.tensor([0, 1]), "truth": torch.tensor([1, 0])}
        arguments[empty_arg] = torch.tensor([], dtype=torch.long)
        with pytest.raises(ValueError, match=empty_arg):
            latent_recovery(**arguments)

    def test_length_mismatch_raises(self):
        with pytest.raises(ValueError, match="length"):
            latent_recovery(torch.tensor([0, 1, 1]), torch.tensor([0, 1]))

    def test_non_integer_or_2d_labels_raise(self):
        with pytest.raises(ValueError, match="integer"):
            latent_recovery(torch.tensor([0.5, 1.0]), torch.tensor([0, 1]))
        with pytest.raises(ValueError, match="1-D"):
            latent_recovery(torch.zeros(2, 2, dtype=torch.long), torch.tensor([0, 1]))


class TestKMeansLabels:
    def test_recovers_well_separated_clusters(self):
        generator = torch.Generator().manual_seed(0)
        centres = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0], [10.0, 10.0]])
        truth = torch.arange(4).repeat_interleave(25)
        points = centres[truth] + 0.1 * torch.randn(100, 2, generator=generator)
        labels = kmeans_labels(points, num_clusters=4, seed=0)
        assert labels.dtype == torch.long and labels.shape == (100,)
        assert latent_recovery(labels, truth)["latent_ari"] == pytest.approx(1.0)

    def test_is_reproducible_for_a_seed(self):
        points = torch.randn(60, 3, generator=torch.Generator().manual_seed(1))
        assert torch.equal(kmeans_labels(points, 3, seed=5), kmeans_labels(points, 3, seed=5))

    def test_fewer_points_than_clusters(self):
        labels = kmeans_labels(torch.tensor([[0.0], [5.0]]), num_clusters=4, seed=0)
        assert sorted(labels.tolist()) == [0, 1]

    def test_empty_points_raise(self):
        with pytest.raises(ValueError, match="points"):
            kmeans_labels(torch.zeros(0, 2), num_clusters=2, seed=0)


class TestDiscreteMutualInformation:
    @pytest.mark.parametrize("num_categories", [2, 5])
    def test_even_one_hot_posteriors_give_log_k(self, num_categories):
        posteriors = torch.eye(num_categories).repeat(3, 1)
        assert discrete_mutual_information(posteriors) == pytest.approx(math.log(num_categories))

    def test_identical_posteriors_give_zero(self):
        posteriors = torch.tensor([[0.2, 0.5, 0.3]]).repeat(10, 1)
        assert discrete_mutual_information(posteriors) == pytest.approx(0.0, abs=1e-12)

    def test_partially_informative_posteriors_lie_between(self):
        posteriors = torch.tensor([[0.9, 0.1], [0.1, 0.9]])
        assert 0.0 < discrete_mutual_information(posteriors) < math.log(2)

    def test_empty_raises(self):
        with pytest.raises(ValueError, match="posterior_probs"):
            discrete_mutual_information(torch.zeros(0, 3))


class TestGaussianMutualInformation:
    def test_a_constant_latent_gives_exactly_zero(self):
        # Every posterior the same: each paired term log q(z_n|x_n) - log q_agg(z_n) cancels.
        for mean, logvar in ((torch.zeros(1000, 2), torch.zeros(1000, 2)),
                             (torch.full((300, 8), 3.0), torch.full((300, 8), -4.0))):
            assert gaussian_mutual_information(mean, logvar, seed=0) == pytest.approx(0.0, abs=1e-12)

    def test_k_separated_groups_give_log_k(self):
        # 4 groups of 100 identical posteriors, far apart: q_agg(z_n) = q(z_n|x_n) / 4.
        groups = torch.arange(4).repeat_interleave(100)
        mean = 30.0 * torch.eye(4, 3)[groups]
        estimate = gaussian_mutual_information(mean, torch.zeros(400, 3), seed=2)
        assert estimate == pytest.approx(math.log(4), abs=1e-9)

    def test_separated_tiny_variance_posteriors_give_log_n(self):
        num_examples = 512  # Monte Carlo noise about sqrt(D / 2N) = 0.044 nats
        mean = 10.0 * torch.arange(num_examples, dtype=torch.float32)[:, None].repeat(1, 2)
        logvar = torch.full((num_examples, 2), -10.0)
        estimate = gaussian_mutual_information(mean, logvar, seed=0)
        assert estimate == pytest.approx(math.log(num_examples), abs=0.15)

    def test_is_reproducible_and_never_negative(self):
        generator = torch.Generator().manual_seed(3)
        mean = 0.01 * torch.randn(50, 3, generator=generator)
        logvar = torch.zeros(50, 3)
        first = gaussian_mutual_information(mean, logvar, seed=7)
        assert first == gaussian_mutual_information(mean, logvar, seed=7)
        assert first >= 0.0

    def test_blocked_computation_matches_one_block(self, monkeypatch):
        import workers.readouts.recovery as metrics

        generator = torch.Generator().manual_seed(4)
        mean = torch.randn(30, 3, generator=generator)
        logvar = 0.5 * torch.randn(30, 3, generator=generator)
        whole = gaussian_mutual_information(mean, logvar, seed=1)
        monkeypatch.setattr(metrics, "_MI_BLOCK_ELEMENTS", 3 * 30 * 4)  # blocks of 4 rows
        assert gaussian_mutual_information(mean, logvar, seed=1) == pytest.approx(whole, rel=1e-12)

    def test_shape_mismatch_and_empty_raise(self):
        with pytest.raises(ValueError, match="shape"):
            gaussian_mutual_information(torch.zeros(3, 2), torch.zeros(3, 3))
        with pytest.raises(ValueError, match="mean"):
            gaussian_mutual_information(torch.zeros(0, 2), torch.zeros(0, 2))


class TestActiveUnits:
    def test_gaussian_counts_dimensions_that_vary_over_x(self):
        generator = torch.Generator().manual_seed(0)
        mean = torch.zeros(500, 4)
        mean[:, 0] = torch.randn(500, generator=generator)  # var ~ 1: active
        mean[:, 1] = 0.3 * torch.randn(500, generator=generator)  # var ~ 0.09: active
        mean[:, 2] = 0.01 * torch.randn(500, generator=generator)  # var ~ 1e-4: inactive
        mean[:, 3] = 5.0  # constant: inactive
        assert active_units_gaussian(mean) == 2
        assert active_units_gaussian(mean, threshold=0.5) == 1

    def test_gaussian_single_example_has_no_active_units(self):
        assert active_units_gaussian(torch.ones(1, 3)) == 0

    def test_used_categories_counts_aggregate_mass(self):
        posteriors = torch.tensor(
            [
                [0.7, 0.3, 0.0, 0.0],
                [0.6, 0.39, 0.01, 0.0],
                [0.8, 0.2, 0.0, 0.0],
                [0.5, 0.5, 0.0, 0.0],
            ]
        )
        # Aggregate mass: [0.65, 0.3475, 0.0025, 0.0].
        assert used_categories(posteriors) == 2
        assert used_categories(posteriors, threshold=0.002) == 3
        assert used_categories(posteriors, threshold=0.0) == 4
        assert used_categories(torch.tensor([[1.0, 0.0, 0.0]]).repeat(8, 1)) == 1

    def test_discrete_active_units_read_zero_under_collapse_and_k_when_used(self):
        # Collapsed, spread evenly: every category used, none active, I(x; z) = 0.
        collapsed = torch.full((400, 4), 0.25)
        assert used_categories(collapsed) == 4
        assert active_units_discrete(collapsed) == 0
        # Winner-take-all (every example on one category, both labels alike): none active, one
        # category used, I(x; z) ~ 0.
        winner = torch.tensor([[0.0001, 0.9999], [0.0002, 0.9998]]).repeat(200, 1)
        assert active_units_discrete(winner) == 0 and used_categories(winner) == 1
        assert discrete_mutual_information(winner) < 1e-4
        # Collapsed on one category, or jittering around uniform (Var = 1e-4): none active.
        assert active_units_discrete(torch.tensor([[1.0, 0.0, 0.0]]).repeat(8, 1)) == 0
        jitter = torch.tensor([[0.26, 0.24, 0.25, 0.25], [0.24, 0.26, 0.25, 0.25]]).repeat(50, 1)
        assert active_units_discrete(jitter) == 0
        # One-hot over K balanced categories: Var_x q(k|x) = (K-1)/K^2 (unbiased: x N/(N-1)).
        one_hot = torch.eye(4).repeat(100, 1)
        assert active_units_discrete(one_hot) == 4
        assert active_units_discrete(one_hot, threshold=0.1875 * 400 / 399 - 1e-9) == 4
        assert active_units_discrete(one_hot, threshold=0.1875 * 400 / 399 + 1e-9) == 0
        # Two groups told apart by categories 0 and 1 only: 2 active, 2 idle.
        halves = torch.tensor([[0.9, 0.1, 0.0, 0.0], [0.1, 0.9, 0.0, 0.0]]).repeat(50, 1)
        assert active_units_discrete(halves) == 2
        assert active_units_discrete(torch.eye(3)[:1]) == 0  # one example: no variance

def test_latent_recovery_equals_scikit_learn_on_random_labelings():
    """The contingency-table NMI/ARI equal scikit-learn's, limit cases included."""
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    rng = np.random.default_rng(0)
    for case in range(400):
        n = int(rng.integers(1, 60))
        truth = rng.integers(0, int(rng.integers(1, 5)), n)
        inferred = (truth + 1) % 4 if case % 3 == 0 else rng.integers(0, int(rng.integers(1, 5)), n)
        got = latent_recovery(inferred, truth)
        assert abs(got["latent_nmi"] - normalized_mutual_info_score(truth, inferred)) < 1e-12
        assert abs(got["latent_ari"] - adjusted_rand_score(truth, inferred)) < 1e-12


def test_chance_readouts_equal_scikit_learn_on_adversarial_labelings():
    """AMI equals scikit-learn's ``adjusted_mutual_info_score`` (its exact expected MI, limit
    cases included) and the shuffled NMI equals its NMI averaged over the same permutations:
    tiny n, every label alone, one cluster, skewed clusters, 50 clusters, negative and large ids."""
    from sklearn.metrics import adjusted_mutual_info_score, normalized_mutual_info_score

    from workers.readouts.recovery import chance_readouts

    rng = np.random.default_rng(7)
    cases = [(np.arange(n), np.arange(n)[::-1] + 10**9) for n in (2, 3, 7)]  # every label alone
    for n in (2, 3, 5, 17, 120, 700):
        for classes in (1, 2, 4, 9):
            truth = rng.integers(0, classes, n) * 7 - 3
            for clusters in (1, 2, 3, 8, 50):
                cases.append((rng.integers(0, clusters, n) + 1000, truth))
                cases.append((np.where(rng.random(n) < 0.95, 0, rng.integers(0, clusters, n)), truth))
            cases.append(((truth * 5 + 1) % 11, truth))  # a relabelling: a perfect recovery
    for inferred, truth in cases:
        got = chance_readouts(inferred, truth, shuffles=5, seed=3)
        permutations = np.random.default_rng(3)
        shuffled = np.mean([normalized_mutual_info_score(permutations.permutation(truth), inferred)
                            for _ in range(5)])
        assert got["latent_ami"] == pytest.approx(adjusted_mutual_info_score(truth, inferred), abs=1e-10)
        assert got["latent_nmi_shuffled"] == pytest.approx(shuffled, abs=1e-12)


def test_chance_readouts_known_answers() -> None:
    """AMI is 1 for a relabelled perfect recovery and ~0 for independent labels; the shuffled
    NMI equals scikit-learn's NMI averaged over the same fixed-seed permutations."""
    import numpy as np
    from sklearn.metrics import normalized_mutual_info_score

    from workers.readouts.recovery import chance_readouts

    rng = np.random.default_rng(3)
    truth = rng.integers(0, 4, 400)
    perfect = chance_readouts((truth + 1) % 4, truth)
    assert perfect["latent_ami"] == pytest.approx(1.0)
    permutations = np.random.default_rng(0)
    expected = np.mean([normalized_mutual_info_score(permutations.permutation(truth), (truth + 1) % 4)
                        for _ in range(20)])
    assert perfect["latent_nmi_shuffled"] == pytest.approx(expected, abs=1e-12)
    assert 0 < perfect["latent_nmi_shuffled"] < 0.03  # 4 even clusters, 400 rows: chance is small
    independent = chance_readouts(rng.integers(0, 4, 400), truth)
    assert abs(independent["latent_ami"]) < 0.02
    small = chance_readouts([0, 1, 0, 1, 2, 2], [0, 0, 1, 1, 2, 2])  # n = 6: chance NMI is large
    assert small["latent_nmi_shuffled"] > 0.2
    assert all(math.isnan(v) for v in chance_readouts([1], [1]).values())
    with pytest.raises(ValueError, match="differ in length"):
        chance_readouts([0, 1], [0])
