"""Latent recovery read-outs: does the CVAE's latent code find the hidden strategy?

Two families of read-outs, both computed on the validation split at log points (never on
the hot path):

- *Recovery* against the ground-truth strategy labels of the synthetic task: NMI and ARI
  between the labels the model infers (argmax of a discrete posterior, or k-means on the
  means of a Gaussian posterior) and the true ones. Both are invariant to relabelling.
- *Use* of the latent, without labels: mutual information I(x; z) under the aggregate
  posterior, and the number of active units (Burda et al. 2016), the standard symptoms
  of posterior collapse.

Everything here is pure torch / numpy / scikit-learn and runs on CPU; tensors on another
device are moved to the CPU first.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch
from sklearn.cluster import KMeans
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import adjusted_mutual_info_score

__all__ = [
    "chance_readouts",
    "active_units_discrete",
    "active_units_gaussian",
    "discrete_mutual_information",
    "gaussian_mutual_information",
    "kmeans_labels",
    "latent_recovery",
]

# Elements of one [chunk, N, D] block in the Gaussian MI estimator: bounds memory at a
# few hundred MB in float64 however large the validation split is.
_MI_BLOCK_ELEMENTS = 1 << 24


def _as_label_array(labels: torch.Tensor | np.ndarray, name: str) -> np.ndarray:
    if isinstance(labels, torch.Tensor):
        labels = labels.detach().cpu().numpy()
    array = np.asarray(labels)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(array.shape)}")
    if array.size == 0:
        raise ValueError(f"{name} is empty")
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{name} must hold integer labels, got dtype {array.dtype}")
    return array


def _as_matrix(values: torch.Tensor, name: str) -> torch.Tensor:
    if values.dim() != 2:
        raise ValueError(f"{name} must be 2-D [N, D], got shape {tuple(values.shape)}")
    if values.shape[0] == 0:
        raise ValueError(f"{name} is empty (N = 0)")
    return values.detach().to(device="cpu", dtype=torch.float64)


def latent_recovery(
    inferred: torch.Tensor | np.ndarray, truth: torch.Tensor | np.ndarray
) -> dict[str, float]:
    """Agreement between inferred latent labels and the true strategy labels.

    Args:
        inferred: 1-D integer labels the model assigns, ``[N]``.
        truth: 1-D integer ground-truth labels, ``[N]``.

    Returns:
        ``{"latent_nmi": ..., "latent_ari": ...}``: normalized mutual information
        (arithmetic normalisation) and adjusted Rand index. Both are 1.0 for a perfect
        recovery up to a permutation of label ids, including the degenerate case where
        both labelings put everything in one cluster. NMI lies in [0, 1]; ARI is about 0
        for independent labelings and can be slightly negative.

    Raises:
        ValueError: If either input is empty, not 1-D, not integer, or their lengths
            differ.
    """
    inferred_array = _as_label_array(inferred, "inferred")
    truth_array = _as_label_array(truth, "truth")
    if inferred_array.shape != truth_array.shape:
        raise ValueError(
            f"inferred and truth differ in length: {inferred_array.size} vs {truth_array.size}"
        )
    return _fast_recovery(truth_array, inferred_array)


def chance_readouts(
    inferred: torch.Tensor | np.ndarray, truth: torch.Tensor | np.ndarray, *, shuffles: int = 20,
    seed: int = 0,
) -> dict[str, float]:
    """Latent recovery beside its chance level, for labels a model could find by accident.

    Returns:
        ``{"latent_ami": ..., "latent_nmi_shuffled": ...}``: the adjusted mutual information
        (arithmetic normalisation, as scikit-learn defines it: 0 in expectation for independent
        labelings, 1 for a perfect recovery) and the mean NMI of ``inferred`` against
        ``shuffles`` fixed-seed permutations of ``truth`` (the NMI a clustering of these sizes
        reaches with no information about the labels). NaN for fewer than 2 examples.

    Raises:
        ValueError: as :func:`latent_recovery`.
    """
    inferred_array = _as_label_array(inferred, "inferred")
    truth_array = _as_label_array(truth, "truth")
    if inferred_array.shape != truth_array.shape:
        raise ValueError(
            f"inferred and truth differ in length: {inferred_array.size} vs {truth_array.size}"
        )
    if truth_array.size < 2:
        return {"latent_ami": math.nan, "latent_nmi_shuffled": math.nan}
    rng = np.random.default_rng(seed)
    shuffled = [_fast_recovery(rng.permutation(truth_array), inferred_array)["latent_nmi"]
                for _ in range(shuffles)]
    return {"latent_ami": float(adjusted_mutual_info_score(truth_array, inferred_array)),
            "latent_nmi_shuffled": float(np.mean(shuffled))}


def _fast_recovery(truth: np.ndarray, inferred: np.ndarray) -> dict[str, float]:
    """NMI (arithmetic) and ARI from one contingency table, as scikit-learn defines them
    (its limit cases included) without its per-call validation overhead (~40 ms a call)."""
    _, t = np.unique(truth, return_inverse=True)
    _, p = np.unique(inferred, return_inverse=True)
    table = np.zeros((t.max() + 1, p.max() + 1), dtype=np.float64)
    np.add.at(table, (t, p), 1.0)
    n = float(truth.size)
    rows, cols = table.sum(1), table.sum(0)
    if table.shape[0] == table.shape[1] == 1:
        nmi = 1.0
    else:
        nz = table > 0
        mi = float((table[nz] / n * np.log(table[nz] * n / np.outer(rows, cols)[nz])).sum())
        h_t = float(-(rows / n * np.log(rows / n)).sum())
        h_p = float(-(cols / n * np.log(cols / n)).sum())
        nmi = 0.0 if abs(mi) < np.finfo(np.float64).eps else max(mi / ((h_t + h_p) / 2), 0.0)
    pairs = lambda x: float((x * (x - 1) / 2).sum())  # noqa: E731
    index, a, b = pairs(table), pairs(rows), pairs(cols)
    expected = a * b / (n * (n - 1) / 2) if n > 1 else 0.0
    maximum = (a + b) / 2
    ari = 1.0 if maximum == expected else (index - expected) / (maximum - expected)
    return {"latent_nmi": float(nmi), "latent_ari": float(ari)}


def kmeans_labels(points: torch.Tensor, num_clusters: int, seed: int) -> torch.Tensor:
    """Cluster continuous latent codes so they can be scored like discrete labels.

    Args:
        points: ``[N, D]`` points, typically posterior means.
        num_clusters: Number of clusters wanted, usually the number of true strategies.
        seed: ``random_state`` of k-means, so the labels are reproducible.

    Returns:
        LongTensor ``[N]`` of cluster ids in ``[0, min(num_clusters, N))``. With fewer
        points than clusters every point is its own cluster. When the points have fewer
        distinct values than clusters, k-means finds fewer clusters (its warning is
        silenced; the labels stay valid).

    Raises:
        ValueError: If ``points`` is not 2-D, is empty, or ``num_clusters < 1``.
    """
    if num_clusters < 1:
        raise ValueError(f"num_clusters must be >= 1, got {num_clusters}")
    matrix = _as_matrix(points, "points").numpy()
    clusters = min(num_clusters, matrix.shape[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        labels = KMeans(n_clusters=clusters, n_init=10, random_state=seed).fit_predict(matrix)
    return torch.as_tensor(labels, dtype=torch.long)


def _entropy(probs: torch.Tensor) -> torch.Tensor:
    # xlogy makes 0 * log 0 = 0, so one-hot rows have exactly zero entropy.
    return -torch.special.xlogy(probs, probs).sum(dim=-1)


def discrete_mutual_information(posterior_probs: torch.Tensor) -> float:
    """I(x; z) of a categorical posterior under the empirical data distribution.

    ``MI = H(mean_n q(z|x_n)) - mean_n H(q(z|x_n))`` in nats, computed in float64.

    Args:
        posterior_probs: ``[N, K]`` rows of q(z|x_n); each row should sum to 1 (rows are
            used as given, not renormalised). Zero entries are fine.

    Returns:
        MI in ``[0, log K]``: 0 when every x has the same posterior (collapse), log K for
        one-hot posteriors spread evenly over the K categories. Clamped at 0 against
        rounding.

    Raises:
        ValueError: If the input is not 2-D or is empty.
    """
    probs = _as_matrix(posterior_probs, "posterior_probs")
    aggregate_entropy = _entropy(probs.mean(dim=0))
    mean_conditional_entropy = _entropy(probs).mean()
    return max(float(aggregate_entropy - mean_conditional_entropy), 0.0)


def gaussian_mutual_information(mean: torch.Tensor, logvar: torch.Tensor, seed: int = 0) -> float:
    """I(x; z) of a diagonal Gaussian posterior, the estimator of He et al. (2019).

    Follows ``calc_mi`` of "Lagging Inference Networks and Posterior Collapse":
    ``E_x E_q(z|x)[log q(z|x)] - E_x E_q(z|x)[log q_agg(z)]``, where the first term is the
    closed-form negative entropy of each posterior and ``q_agg`` is approximated by the
    uniform mixture of the N posteriors in the batch, evaluated at one sample
    ``z_n ~ q(z|x_n)`` per example. Computed in float64 with logsumexp, in blocks so
    memory stays bounded for large N.

    Args:
        mean: ``[N, D]`` posterior means.
        logvar: ``[N, D]`` posterior log-variances.
        seed: Seed of the generator that draws the z samples, so the estimate is
            reproducible.

    Returns:
        MI estimate in nats, at most about ``log N`` (the mixture estimate cannot
        exceed it): near 0 when all posteriors are the same, near ``log N`` for N
        well-separated posteriors with tiny variance. Clamped at 0, since the estimate
        is noisy and can dip below.

    Raises:
        ValueError: If the inputs are not 2-D, are empty, or differ in shape.
    """
    mu = _as_matrix(mean, "mean")
    log_variance = _as_matrix(logvar, "logvar")
    if mu.shape != log_variance.shape:
        raise ValueError(
            f"mean and logvar differ in shape: {tuple(mu.shape)} vs {tuple(log_variance.shape)}"
        )
    num_examples, num_dims = mu.shape
    log_two_pi = math.log(2 * math.pi)

    negative_entropy = (-0.5 * num_dims * log_two_pi - 0.5 * (1 + log_variance).sum(-1)).mean()

    generator = torch.Generator().manual_seed(seed)
    noise = torch.randn(mu.shape, generator=generator, dtype=torch.float64)
    samples = mu + torch.exp(0.5 * log_variance) * noise

    inverse_variance = torch.exp(-log_variance)  # [N, D]
    log_normaliser = -0.5 * (num_dims * log_two_pi + log_variance.sum(-1))  # [N]
    chunk = max(1, _MI_BLOCK_ELEMENTS // max(1, num_examples * num_dims))
    log_aggregate = []
    for start in range(0, num_examples, chunk):
        deviation = samples[start : start + chunk, None, :] - mu[None, :, :]  # [c, N, D]
        log_density = -0.5 * (deviation.square() * inverse_variance).sum(-1) + log_normaliser
        log_aggregate.append(torch.logsumexp(log_density, dim=1) - math.log(num_examples))
    mean_log_aggregate = torch.cat(log_aggregate).mean()
    return max(float(negative_entropy - mean_log_aggregate), 0.0)


def active_units_gaussian(mean: torch.Tensor, threshold: float = 0.01) -> int:
    """Number of active latent dimensions (Burda et al. 2016).

    A dimension is active when ``Var_x(E_q(z|x)[z_d]) > threshold``, the variance over
    examples (unbiased, as in He et al. 2019) of its posterior mean.

    Args:
        mean: ``[N, D]`` posterior means.
        threshold: Variance above which a dimension counts as active.

    Returns:
        Count in ``[0, D]``. 0 when N = 1 (the variance is undefined). NaN variances
        (NaN means) never count as active.

    Raises:
        ValueError: If the input is not 2-D or is empty.
    """
    mu = _as_matrix(mean, "mean")
    if mu.shape[0] < 2:
        return 0
    variance = mu.var(dim=0, correction=1)
    return int((variance > threshold).sum())


def active_units_discrete(posterior_probs: torch.Tensor, threshold: float = 0.01) -> int:
    """Number of categories the aggregate posterior actually uses.

    A category k is active when ``mean_n q(k|x_n) >= threshold``.

    Args:
        posterior_probs: ``[N, K]`` rows of q(z|x_n).
        threshold: Aggregate mass at or above which a category counts as active.

    Returns:
        Count in ``[0, K]``; categories with NaN mass never count.

    Raises:
        ValueError: If the input is not 2-D or is empty.
    """
    probs = _as_matrix(posterior_probs, "posterior_probs")
    return int((probs.mean(dim=0) >= threshold).sum())
