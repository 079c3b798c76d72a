"""A cohort's epoch-end read-outs: today's code against the library calls it replaced, side by side.

The members' eval-mode outputs come from one batched forward (``member_outputs``, as a cohort's
epoch end runs it, outside the timing); then each member's ``Trainer.evaluate_split`` read-outs
run on train (subset), val and test. ``current`` is the code as it stands; ``reference`` swaps in the
calls the read-outs made before: scikit-learn's ``adjusted_mutual_info_score`` and one
contingency table per shuffle (``latent_recovery``) for ``chance_readouts``, ``scipy.stats.spearmanr`` for
``kl_kappa_spearman``, and (continuous family) I(x; z) drawing its own posterior samples
instead of sharing those of the split's I(z; s). Both paths run interleaved in one process
(medians of ``--repeats``); their values are checked equal (abs 1e-9) first.

``python -m benchmarks.bench_readouts [--members 32] [--families discrete continuous] [--repeats 3]``
"""

from __future__ import annotations

import argparse
import contextlib
import math
import tempfile
import warnings
from collections.abc import Iterator

import numpy as np
import torch

from benchmarks._timing import interleaved_medians, print_ratios
from benchmarks.bench_cohort import sweep_configs
from workers.cohort.evaluation import member_outputs
from workers.cohort.trainer import Cohort
from workers.readouts import latent
from workers.readouts import recovery as metrics
from workers.train import Trainer


def reference_chance_readouts(inferred, truth, *, shuffles: int = 20, seed: int = 0) -> dict[str, float]:
    """``chance_readouts`` as it was: scikit-learn's AMI, and one contingency table per permutation."""
    from sklearn.metrics import adjusted_mutual_info_score

    inferred, truth = np.asarray(inferred), np.asarray(truth)
    if truth.size < 2:
        return {"latent_ami": math.nan, "latent_nmi_shuffled": math.nan}
    rng = np.random.default_rng(seed)
    shuffled = [metrics.latent_recovery(inferred, rng.permutation(truth))["latent_nmi"] for _ in range(shuffles)]
    return {"latent_ami": float(adjusted_mutual_info_score(truth, inferred)),
            "latent_nmi_shuffled": float(np.mean(shuffled))}


def reference_rank_correlation(x: np.ndarray, y: np.ndarray) -> float:
    """``kl_kappa_spearman``'s rho through ``scipy.stats.spearmanr``."""
    from scipy.stats import spearmanr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(spearmanr(x, y).statistic)


@contextlib.contextmanager
def reference_readouts() -> Iterator[None]:
    """The read-outs with the library calls above (restored on exit)."""
    mutual_information = metrics.gaussian_mutual_information
    swaps = [(metrics, "chance_readouts", reference_chance_readouts),
             (latent, "_rank_correlation", reference_rank_correlation),
             (metrics, "gaussian_mutual_information",
              lambda mean, logvar, seed=0, sampled=None: mutual_information(mean, logvar, seed))]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in swaps]
    for owner, name, value in swaps:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def epoch_end_readouts(trainers: list[Trainer], outputs: list[dict]) -> list[dict[str, float]]:
    """Every member's read-outs of each split it reads, on the batched forward's ``outputs``."""
    return [{key: value for name, collected in out.items()
             for key, value in Trainer.evaluate_split(trainer, name, collected).items()}
            for trainer, out in zip(trainers, outputs, strict=True)]


def measure(family: str, members: int, repeats: int) -> dict[str, float]:
    configs = [c.model_copy(update={"model": c.model.model_copy(update={"family": family})})
               for c in sweep_configs(members, 2, 256)]
    cohort = Cohort.create(configs, tempfile.mkdtemp(prefix="ksweep-bench-readouts-"))
    cohort.run_epoch()  # trained a little: read-outs of a model that has moved off its start
    trainers = [m.trainer for m in cohort.active]
    outputs = member_outputs(cohort.params, cohort.model_config, cohort.num_categories, trainers,
                             cohort._eval_cache)
    current = epoch_end_readouts(trainers, outputs)
    with reference_readouts():
        reference = epoch_end_readouts(trainers, outputs)
    for mine, theirs in zip(current, reference, strict=True):
        for key, value in theirs.items():
            if not (math.isnan(value) and math.isnan(mine[key])) and abs(mine[key] - value) > 1e-9:
                raise AssertionError(f"{key}: {mine[key]} vs the reference's {value}")

    def with_reference() -> None:
        with reference_readouts():
            epoch_end_readouts(trainers, outputs)

    return interleaved_medians({"reference": with_reference,
                                "current": lambda: epoch_end_readouts(trainers, outputs)},
                               repeats=repeats, warmup=1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=32)
    parser.add_argument("--families", nargs="+", default=["discrete", "continuous"])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    for family in args.families:
        medians = measure(family, args.members, args.repeats)
        print_ratios(f"epoch-end read-outs of a cohort of {args.members} ({family}; train subset 256, "
                     f"val 128, test 128 examples per member; values equal to 1e-9)", medians, "reference")
        print(f"  per member: {1e3 * medians['reference'] / args.members:.1f} ms -> "
              f"{1e3 * medians['current'] / args.members:.1f} ms")


if __name__ == "__main__":
    main()
