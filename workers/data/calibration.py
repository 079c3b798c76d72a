"""Kappa matching of the mixed task: the private block size M that makes ``private`` examples as
concentrated as ``prefix`` examples (:func:`matched_private_prefix_tokens`).
"""

from __future__ import annotations

import functools
import math

import torch

from objectives import token_weight_stats

CALIBRATION_SEED = 12345
CALIBRATION_SIZE = 2000
CALIBRATION_ALPHAS = (1.0, 2.0)
MAX_PRIVATE_PREFIX_TOKENS = 100_000_000


def _calibration_sample(config):
    """b_t of a fixed sample (half prefix, half private) at M = 1, and its kinds."""
    from workers.data.config import KINDS, KindProportions
    from workers.data.oracle import oracle_base_nll
    from workers.data.synthetic import generate_split

    sample_config = config.model_copy(update={
        "kind_proportions": KindProportions(prefix=1.0, diffuse=0.0, private=1.0),
        "private_prefix_tokens": 1, "seed": CALIBRATION_SEED, "val_size": 2 * CALIBRATION_SIZE,
    })
    split = generate_split(sample_config, "val")
    b = oracle_base_nll(sample_config, split, dtype=torch.float64)
    private = split.kind == KINDS.index("private")
    private_prefix = private[:, None] & (torch.arange(b.shape[1]) == 0)[None, :]
    return b, split.mask, split.kind, private_prefix


def kappa_by_kind(b: torch.Tensor, mask: torch.Tensor, kind: torch.Tensor, alpha: float):
    """Per-example kappa_alpha split by kind id: ``{kind_id: [n_kind] float64}``."""
    kappa = token_weight_stats(b, mask, alpha).kappa.double()
    return {int(k): kappa[kind == k] for k in kind.unique()}


def matched_private_prefix_tokens(config) -> int:
    """The M of ``config`` (a mixed-task SyntheticTaskConfig) that matches median kappa.

    The first private prefix token costs exactly ``log M`` nats under the oracle (with or
    without s), and nothing else in an example depends on M. So the b_t of a calibration sample
    are computed once with M = 1 and that position is set to ``log M`` for each
    candidate; M is the integer where the median kappa of `private` examples best matches
    the median of `prefix` examples at alpha 1 and 2 together: the root of
    ``log(med_private/med_prefix) at alpha 1 + the same at alpha 2`` (bisection on log M;
    kappa grows with M once the prefix is the most surprising part of the example). One M
    cannot match both exactly; on the default task each median ends within about 6%. The sample is fixed (seed
    ``CALIBRATION_SEED``, ``CALIBRATION_SIZE`` examples of each kind), so M is a function of
    the task's shape only, never of the data seed or the split sizes.

    Cached per task shape (seed and split sizes do not enter), to 2% in M.

    Raises:
        ValueError: When no M up to ``MAX_PRIVATE_PREFIX_TOKENS`` reaches the `prefix`
            examples' median kappa (e.g. a noisy private body that is already more surprising
            than any prefix); the message names ``private_prefix_tokens`` and the noise fields.
    """
    shape = config.model_copy(update={"seed": None, "train_size": 1, "val_size": 1, "test_size": 1})
    return _matched(shape)


@functools.lru_cache(maxsize=64)
def _matched(config) -> int:
    b, mask, kind, private_prefix = _calibration_sample(config)

    def mismatch(size: int) -> float:
        """Sum over the calibration alphas of log(median private kappa / median prefix kappa)."""
        filled = torch.where(private_prefix, math.log(size), b)
        total = 0.0
        for alpha in CALIBRATION_ALPHAS:
            kappas = kappa_by_kind(filled, mask, kind, alpha)
            total += math.log(float(kappas[2].median()) / float(kappas[0].median()))
        return total

    low, high = 1, MAX_PRIVATE_PREFIX_TOKENS
    if mismatch(high) < 0:
        raise ValueError(
            f"data.private_prefix_tokens: no private block size up to {high} makes private "
            "examples as concentrated as prefix examples; lower data.private_noise_rate or set "
            "private_prefix_tokens yourself"
        )
    while high - low > 1 and high > 1.02 * low:
        middle = min(max(int(math.sqrt(low * high)), low + 1), high - 1)
        if mismatch(middle) < 0:
            low = middle
        else:
            high = middle
    return min((low, high), key=lambda size: abs(mismatch(size)))
