"""kappa_alpha of real text beside the synthetic task's, as numbers and one figure.

Real text: each row's b_t under the real-text study's causal LM (cached; no model load).
Synthetic: the caveat study's task (``sweeps/examples/note_caveat.yaml``'s data section) under
its exact z-free oracle base, train split, per example kind. Both through the objective
library's own ``token_weight_stats`` (float64).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from ruamel.yaml import YAML

from objectives import token_weight_stats
from workers.contract import EXAMPLE_KINDS
from workers.data.config import SyntheticTaskConfig
from workers.data.oracle import oracle_base_nll
from workers.data.synthetic import generate_split

ROOT = Path(__file__).resolve().parents[1]
SYNTHETIC_SPEC = ROOT / "sweeps" / "examples" / "note_caveat.yaml"
ALPHAS = (1.0, 2.0)


def kappas(rows: Sequence[np.ndarray], alpha: float) -> np.ndarray:
    """kappa_alpha of each row of per-token surprisals (rows of different lengths)."""
    width = max(map(len, rows))
    nll = torch.zeros(len(rows), width, dtype=torch.float64)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, row in enumerate(rows):
        nll[i, :len(row)] = torch.as_tensor(np.asarray(row, dtype=np.float64))
        mask[i, :len(row)] = True
    return token_weight_stats(nll, mask, alpha, validate=True).kappa.numpy()


def describe(values: np.ndarray) -> dict[str, float]:
    """Mean and the 10th, 50th and 90th percentiles, rounded to 3 decimals."""
    p10, p50, p90 = np.quantile(values, [0.1, 0.5, 0.9])
    return {"n": int(values.size), "mean": round(float(values.mean()), 3),
            "p10": round(float(p10), 3), "p50": round(float(p50), 3), "p90": round(float(p90), 3)}


def synthetic_rows(spec: Path = SYNTHETIC_SPEC) -> dict[str, list[np.ndarray]]:
    """The synthetic task's train split: b_t rows under the oracle, by example kind."""
    data = YAML(typ="safe").load(spec.read_text())["template"]["data"]
    config = SyntheticTaskConfig(**data)
    split = generate_split(config, "train")
    base = oracle_base_nll(config, split, dtype=torch.float64)
    out: dict[str, list[np.ndarray]] = {kind: [] for kind in EXAMPLE_KINDS}
    for row, mask, kind in zip(base, split.mask, split.kind, strict=True):
        out[EXAMPLE_KINDS[int(kind)]].append(row[mask].numpy())
    return {kind: rows for kind, rows in out.items() if rows}


def compare(real: Mapping[str, Sequence[np.ndarray]], figure: Path) -> dict[str, object]:
    """kappa_1 and kappa_2 of every group of ``real`` and of the synthetic kinds; one figure
    with a histogram per alpha (real text in colour, the synthetic kinds in grey lines)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    synthetic = synthetic_rows()
    groups = {**{f"real: {k}": v for k, v in real.items()},
              **{f"synthetic: {k}": v for k, v in synthetic.items()}}
    summary: dict[str, object] = {}
    fig, axes = plt.subplots(1, len(ALPHAS), figsize=(11, 4))
    for ax, alpha in zip(axes, ALPHAS, strict=True):
        values = {name: kappas(rows, alpha) for name, rows in groups.items()}
        summary[f"kappa_{alpha:g}"] = {name: describe(v) for name, v in values.items()}
        top = float(np.quantile(np.concatenate(list(values.values())), 0.995))
        bins = np.linspace(1.0, max(top, 1.5), 60)
        for name, v in values.items():
            synthetic_kind = name.startswith("synthetic")
            ax.hist(v, bins=bins, density=True, histtype="step", linewidth=1.5,
                    linestyle="--" if synthetic_kind else "-", label=name)
        ax.set_xlabel(f"kappa_{alpha:g} per example")
        ax.set_ylabel("density")
        ax.set_title(f"alpha = {alpha:g}")
    axes[0].legend(fontsize=7)
    fig.suptitle("Concentration of surprisal: real text (causal LM base) vs the synthetic task "
                 "(oracle base)", fontsize=10)
    fig.tight_layout()
    figure.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(figure, dpi=100)
    plt.close(fig)
    return summary
