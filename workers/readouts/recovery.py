"""Latent recovery read-outs: does the CVAE's latent code find the hidden strategy?

Recovery against the true labels: NMI and ARI (AMI beside chance) between the labels the model
infers (argmax of a discrete posterior, k-means on a Gaussian posterior's means) and the true
ones, invariant to relabelling. Use of the latent, without labels: I(x; z) under the aggregate
posterior and the active units (Burda et al. 2016), both 0 for a posterior that ignores x (the
discrete ``used_categories`` is not such a symptom: a collapsed posterior fills all K). Pure
torch, numpy and scikit-learn on CPU, at log points only.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch
from scipy.special import gammaln

__all__ = [
    "chance_readouts",
    "active_units_discrete",
    "active_units_gaussian",
    "used_categories",
    "discrete_mutual_information",
    "gaussian_mutual_information",
    "log_mixture",
    "posterior_samples",
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
    truth_codes, classes = _codes(truth_array)
    inferred_codes, clusters = _codes(inferred_array)
    rng = np.random.default_rng(seed)
    # Permuting the codes consumes the generator as permuting the labels would: same shuffles.
    rows = np.stack([truth_codes, *(rng.permutation(truth_codes) for _ in range(shuffles))])
    tables = _contingency(rows, inferred_codes, classes, clusters)
    nmi, _, mi, mean_entropy = _scores(tables)
    return {"latent_ami": _adjusted_mutual_information(tables[0], float(mi[0]), float(mean_entropy[0])),
            "latent_nmi_shuffled": float(nmi[1:].mean())}


def _codes(labels: np.ndarray) -> tuple[np.ndarray, int]:
    """Each label's index among the distinct labels, and how many there are."""
    uniques, codes = np.unique(labels, return_inverse=True)
    return codes.reshape(-1), int(uniques.size)


def _contingency(truth_rows: np.ndarray, inferred: np.ndarray, classes: int, clusters: int) -> np.ndarray:
    """``[S, classes, clusters]`` counts: one contingency table per row of ``truth_rows`` (codes)
    against ``inferred`` (codes), all from one ``bincount``."""
    count = truth_rows.shape[0]
    cells = (np.arange(count)[:, None] * classes + truth_rows) * clusters + inferred[None, :]
    size = count * classes * clusters
    return np.bincount(cells.ravel(), minlength=size).reshape(count, classes, clusters).astype(np.float64)


def _scores(tables: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """NMI (arithmetic), ARI, MI (nats) and the mean of the two labelings' entropies (NMI's
    normaliser) of each ``[S, classes, clusters]`` table, as scikit-learn defines them, its
    limit cases included."""
    n = tables[0].sum()
    rows, cols = tables.sum(2), tables.sum(1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = tables * n / (rows[:, :, None] * cols[:, None, :])
        mi = np.where(tables > 0, tables / n * np.log(ratio), 0.0).sum((1, 2))
        h_rows = -np.where(rows > 0, rows / n * np.log(rows / n), 0.0).sum(1)
        h_cols = -np.where(cols > 0, cols / n * np.log(cols / n), 0.0).sum(1)
        mean_entropy = (h_rows + h_cols) / 2
        nmi = np.maximum(mi / mean_entropy, 0.0)
    nmi = np.where(np.abs(mi) < np.finfo(np.float64).eps, 0.0, nmi)
    if tables.shape[1] == tables.shape[2] == 1:
        nmi = np.ones_like(mi)  # both labelings put everything in one cluster: a perfect match

    def pairs(counts: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        return (counts * (counts - 1) / 2).sum(axes)

    index, a, b = pairs(tables, (1, 2)), pairs(rows, (1,)), pairs(cols, (1,))
    expected = a * b / (n * (n - 1) / 2) if n > 1 else np.zeros_like(a)
    maximum = (a + b) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        ari = np.where(maximum == expected, 1.0, (index - expected) / (maximum - expected))
    return nmi, ari, mi, mean_entropy


def _expected_mutual_information(rows: np.ndarray, cols: np.ndarray) -> float:
    """E[MI] over all tables with these marginals under the hypergeometric model (Vinh, Epps
    and Bailey 2010, eq. 24a): for each cell, the sum over its possible counts n_ij of
    ``n_ij / N log(N n_ij / (a_i b_j))`` times the count's hypergeometric probability."""
    n = rows.sum()
    b = cols[:, None]
    counts = np.arange(1, int(min(rows.max(), cols.max())) + 1)[None, :]

    def clipped(x: np.ndarray) -> np.ndarray:
        return np.maximum(x, 0) + 1  # gammaln's argument at impossible counts (masked below)

    total = 0.0
    for a in rows:  # one class at a time bounds memory at clusters x max count
        possible = (counts >= a + b - n) & (counts <= np.minimum(a, b))
        log_probability = (gammaln(a + 1) + gammaln(b + 1) + gammaln(n - a + 1) + gammaln(n - b + 1)
                           - gammaln(n + 1) - gammaln(counts + 1) - gammaln(clipped(a - counts))
                           - gammaln(clipped(b - counts)) - gammaln(clipped(n - a - b + counts)))
        term = counts / n * (np.log(n) + np.log(counts) - np.log(a) - np.log(b)) * np.exp(log_probability)
        total += float(np.where(possible, term, 0.0).sum())
    return total


def _adjusted_mutual_information(table: np.ndarray, mi: float, mean_entropy: float) -> float:
    """AMI (arithmetic normalisation) of one contingency table whose MI is ``mi`` and whose
    labelings' mean entropy is ``mean_entropy`` (both from :func:`_scores`), with
    scikit-learn's limit cases: 1 when both labelings are one cluster or when the expected MI
    is the maximum, 0 when one labeling is one cluster."""
    classes, clusters = table.shape
    if classes == clusters == 1:
        return 1.0
    if classes == 1 or clusters == 1:
        return 0.0
    emi = _expected_mutual_information(table.sum(1), table.sum(0))
    denominator = mean_entropy - emi
    if abs(denominator) <= 1e-12 * max(1.0, emi):
        return 1.0  # every table with these marginals is a perfect match (each label alone)
    eps = np.finfo(np.float64).eps  # the expectation can pass the maximum by rounding: keep the sign
    denominator = min(denominator, -eps) if denominator < 0 else max(denominator, eps)
    return float((max(mi, 0.0) - emi) / denominator)


def _fast_recovery(truth: np.ndarray, inferred: np.ndarray) -> dict[str, float]:
    """NMI (arithmetic) and ARI from one contingency table, as scikit-learn defines them
    (its limit cases included) without its per-call validation overhead (~40 ms a call)."""
    truth_codes, classes = _codes(truth)
    inferred_codes, clusters = _codes(inferred)
    nmi, ari, _, _ = _scores(_contingency(truth_codes[None, :], inferred_codes, classes, clusters))
    return {"latent_nmi": float(nmi[0]), "latent_ari": float(ari[0])}


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
    # Imported here: only the continuous family clusters, and scikit-learn costs a trial worker
    # about 0.2 s (with scipy.stats, which it loads, about 0.8 s).
    from sklearn.cluster import KMeans
    from sklearn.exceptions import ConvergenceWarning

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


def gaussian_mutual_information(mean: torch.Tensor, logvar: torch.Tensor, seed: int = 0, *,
                                sampled: tuple[torch.Tensor, torch.Tensor] | None = None) -> float:
    """I(x; z) of a diagonal Gaussian posterior: a paired mixture estimate (He et al. 2019).

    ``mean_n [log q(z_n|x_n) - log q_agg(z_n)]`` with one seeded ``z_n ~ q(z|x_n)`` per example
    and ``q_agg`` the uniform mixture of the split's N posteriors (``calc_mi`` of "Lagging
    Inference Networks and Posterior Collapse", whose first term is the closed-form negative
    entropy; taken at the same sample here, so posteriors that do not depend on x give exactly
    0 and each term is at most ``log N``). Float64, logsumexp, in blocks of bounded memory.

    Args:
        mean: ``[N, D]`` posterior means.
        logvar: ``[N, D]`` posterior log-variances.
        seed: Seed of the generator that draws the z samples, so the estimate is
            reproducible.
        sampled: :func:`posterior_samples` of the same ``mean``, ``logvar`` and ``seed``
            when the caller already drew them (I(z; s) starts from the same ones).

    Returns:
        MI estimate in nats, in ``[0, log N]``: 0 when all posteriors are the same (to
        rounding), ``log K`` for K well-separated groups of equal size and identical
        posteriors within a group, near ``log N`` for N well-separated posteriors. Clamped
        at 0, since the estimate can dip below.

    Raises:
        ValueError: If the inputs are not 2-D, are empty, or differ in shape.
    """
    mu = _as_matrix(mean, "mean")
    log_variance = _as_matrix(logvar, "logvar")
    if mu.shape != log_variance.shape:
        raise ValueError(
            f"mean and logvar differ in shape: {tuple(mu.shape)} vs {tuple(log_variance.shape)}"
        )
    samples, log_aggregate = sampled if sampled is not None else posterior_samples(mu, log_variance, seed)
    return max(float((_log_own_density(samples, mu, log_variance) - log_aggregate).mean()), 0.0)


def _log_own_density(samples: torch.Tensor, mean: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    """``log N(samples_n; mean_n, diag exp(logvar_n))`` per row, ``[N]``: one term of
    :func:`log_mixture` in the same arithmetic, so equal posteriors cancel exactly."""
    log_normaliser = -0.5 * (mean.shape[1] * math.log(2 * math.pi) + logvar.sum(-1))
    return -0.5 * ((samples - mean).square() * torch.exp(-logvar)).sum(-1) + log_normaliser


def posterior_samples(mean: torch.Tensor, logvar: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One seeded sample ``z_n ~ q(z|x_n)`` per row (float64, CPU) and ``log q_agg(z_n)``, the
    uniform mixture of all N posteriors at it: where I(x; z) and I(z; s) both start."""
    mu, log_variance = _as_matrix(mean, "mean"), _as_matrix(logvar, "logvar")
    generator = torch.Generator().manual_seed(seed)
    noise = torch.randn(mu.shape, generator=generator, dtype=torch.float64)
    samples = mu + torch.exp(0.5 * log_variance) * noise
    return samples, log_mixture(samples, mu, log_variance)


def log_mixture(samples: torch.Tensor, mean: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    """``log (1/M) sum_m N(samples_n; mean_m, diag exp(logvar_m))`` for every sample, ``[N]``,
    in blocks of at most ``_MI_BLOCK_ELEMENTS`` so memory stays bounded for large N."""
    count, num_dims = mean.shape
    inverse_variance = torch.exp(-logvar)  # [M, D]
    log_normaliser = -0.5 * (num_dims * math.log(2 * math.pi) + logvar.sum(-1))  # [M]
    chunk = max(1, _MI_BLOCK_ELEMENTS // max(1, count * num_dims))
    out = []
    for start in range(0, samples.shape[0], chunk):
        deviation = samples[start : start + chunk, None, :] - mean[None, :, :]  # [c, M, D]
        log_density = -0.5 * (deviation.square() * inverse_variance).sum(-1) + log_normaliser
        out.append(torch.logsumexp(log_density, dim=1) - math.log(count))
    return torch.cat(out)


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
    """Active units of a categorical latent: Burda et al. (2016) on its one-hot coordinates.

    A categorical z is the one-hot vector e_z, so ``E_q(z|x)[e_z] = q(.|x)`` and unit k's
    activity is ``Var_x q(k|x)`` (unbiased, as :func:`active_units_gaussian`): a category is
    active when its probability moves with x by more than ``threshold``. A posterior that is
    the same for every x, however spread, has 0; one-hot posteriors spread evenly over K
    categories have K (variance (K-1)/K^2 > 0.01 for K <= 98); the probabilities sum to 1,
    so a latent in use has at least 2. Returns a count in ``[0, K]`` (0 when N = 1; NaN
    variances never count); raises ValueError if the input is not 2-D or is empty.
    """
    probs = _as_matrix(posterior_probs, "posterior_probs")
    if probs.shape[0] < 2:
        return 0
    return int((probs.var(dim=0, correction=1) > threshold).sum())


def used_categories(posterior_probs: torch.Tensor, threshold: float = 0.01) -> int:
    """Categories the aggregate posterior gives mass, ``mean_n q(k|x_n) >= threshold``, in
    ``[0, K]`` (NaN mass never counts; ValueError if not 2-D or empty). Not a measure of use: a
    collapsed posterior spread the same way over K categories for every x uses all K."""
    probs = _as_matrix(posterior_probs, "posterior_probs")
    return int((probs.mean(dim=0) >= threshold).sum())
