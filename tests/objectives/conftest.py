"""An independent high-precision reference for the objective family (docs/concepts/objectives.md).

Everything here is computed straight from the formulas with mpmath (60 significant
digits), so powers such as ``(1e-30) ** 20`` or ``100 ** 21`` neither overflow nor
underflow. It shares no code with ``objectives/``. Test modules get it through the
session-scoped ``ref`` fixture (session scope keeps hypothesis' function-scoped-fixture
health check quiet; the object is stateless).
"""

from __future__ import annotations

from dataclasses import dataclass

import mpmath
import pytest
import torch

_DPS = 60


@dataclass(frozen=True)
class RowReference:
    """Reference values of one example (exact up to 60 digits, as mpmath numbers)."""

    weights: list  # pi_t over the row's active tokens, in order
    kappa: object
    base_uniform: object
    base_weighted: object
    r_tok: object
    r_tilde: object
    n_active: int


class Reference:
    """Direct evaluation of the quantities of docs/concepts/objectives.md, one example at a time."""

    @staticmethod
    def row(b_active: list[float], l_active: list[float] | None, alpha: float) -> RowReference:
        """All per-example values from the active b (and l) of one row.

        Conventions (docs/concepts/objectives.md): alpha = 0 is exactly uniform (0^0 = 1); alpha > 0
        gives b_t = 0 weight 0; an all-zero row falls back to uniform weights and
        kappa = 1; an empty row gives 0 everywhere.
        """
        with mpmath.workdps(_DPS):
            n = len(b_active)
            if l_active is None:
                l_active = list(b_active)
            zero = mpmath.mpf(0)
            if n == 0:
                return RowReference([], zero, zero, zero, zero, zero, 0)
            b = [mpmath.mpf(float(v)) for v in b_active]
            ell = [mpmath.mpf(float(v)) for v in l_active]
            a = mpmath.mpf(float(alpha))
            # 0^0 = 1 (alpha = 0 is exactly uniform); 0^alpha = 0 for alpha > 0.
            powers = [mpmath.mpf(1) if a == 0 else (v**a if v > 0 else zero) for v in b]
            m1 = mpmath.fsum(b) / n
            sum_alpha = mpmath.fsum(powers)
            if all(v == 0 for v in b):  # every active b_t is 0 (any alpha)
                weights = [mpmath.mpf(1) / n] * n
                r_tok = mpmath.fsum(ell) / n
                return RowReference(weights, mpmath.mpf(1), m1, zero, r_tok, r_tok, n)
            m_alpha = sum_alpha / n
            m_alpha_plus_one = mpmath.fsum(p * v for p, v in zip(powers, b, strict=True)) / n
            weights = [p / sum_alpha for p in powers]
            kappa = m_alpha_plus_one / (m_alpha * m1)
            base_weighted = m_alpha_plus_one / m_alpha
            r_tok = mpmath.fsum(w * x for w, x in zip(weights, ell, strict=True))
            # The closed form of R~, evaluated directly (not as R_tok / kappa).
            r_tilde = m1 * mpmath.fsum(p * x for p, x in zip(powers, ell, strict=True)) / (
                mpmath.fsum(p * v for p, v in zip(powers, b, strict=True))
            )
            return RowReference(weights, kappa, m1, base_weighted, r_tok, r_tilde, n)

    def batch(
        self,
        base_nll: torch.Tensor,
        mask: torch.Tensor,
        alpha: float,
        token_nll: torch.Tensor | None = None,
        c_base: float | None = None,
    ) -> dict[str, torch.Tensor]:
        """Reference values for a batch, as float64 tensors (off-mask weights are 0).

        Keys: weights [B, T], kappa, base_uniform, base_weighted, r_tok, r_tilde, n_active,
        and, when c_base is given, r_hat [B] and loss (the mean of r_hat over active rows).
        """
        b_rows = base_nll.detach().to(torch.float64).tolist()
        m_rows = mask.tolist()
        l_rows = None if token_nll is None else token_nll.detach().to(torch.float64).tolist()
        batch_size = len(m_rows)
        width = len(m_rows[0]) if batch_size else 0
        out = {key: [] for key in ("kappa", "base_uniform", "base_weighted", "r_tok", "r_tilde")}
        weights = [[0.0] * width for _ in range(batch_size)]
        n_active = []
        rows = []
        for i in range(batch_size):
            idx = [t for t in range(width) if m_rows[i][t]]
            b_active = [b_rows[i][t] for t in idx]
            l_active = None if l_rows is None else [l_rows[i][t] for t in idx]
            r = self.row(b_active, l_active, alpha)
            rows.append(r)
            for t, w in zip(idx, r.weights, strict=True):
                weights[i][t] = float(w)
            for key in out:
                out[key].append(float(getattr(r, key)))
            n_active.append(r.n_active)
        result = {key: torch.tensor(v, dtype=torch.float64) for key, v in out.items()}
        result["weights"] = torch.tensor(weights, dtype=torch.float64).reshape(batch_size, width)
        result["n_active"] = torch.tensor(n_active, dtype=torch.int64)
        if c_base is not None:
            with mpmath.workdps(_DPS):
                c = mpmath.mpf(float(c_base))
                r_hat = [r.r_tilde / c if r.n_active else mpmath.mpf(0) for r in rows]
                active = [x for x, r in zip(r_hat, rows, strict=True) if r.n_active]
                loss = mpmath.fsum(active) / len(active) if active else mpmath.mpf(0)
            result["r_hat"] = torch.tensor([float(x) for x in r_hat], dtype=torch.float64)
            result["loss"] = torch.tensor(float(loss), dtype=torch.float64)
        return result

    @staticmethod
    def c_base(batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
        """E_D[b_u]: the mean over examples (with an active token) of each one's token mean."""
        with mpmath.workdps(_DPS):
            means = []
            for base_nll, mask in batches:
                for b_row, m_row in zip(base_nll.tolist(), mask.tolist(), strict=True):
                    active = [mpmath.mpf(float(v)) for v, m in zip(b_row, m_row, strict=True) if m]
                    if active:
                        means.append(mpmath.fsum(active) / len(active))
            return float(mpmath.fsum(means) / len(means))


@pytest.fixture(scope="session")
def ref() -> Reference:
    """The independent high-precision reference implementation."""
    return Reference()
