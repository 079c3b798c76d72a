"""Streaming estimate of the distribution-level z-free reference scale c_base."""

from __future__ import annotations

import math

import torch

from objectives._checks import check_pair, check_values

__all__ = ["ReferenceScale"]


class ReferenceScale:
    """c_base = E_D[b_u]: the mean over EXAMPLES of each example's own token mean of b.

    This is not the mean over all tokens pooled: a long example counts once, as
    in the batch reduction of every objective here. Rows with no active token
    are skipped. Sums are kept in float64 on the inputs' device, so ``update``
    never synchronises with the host; only ``compute`` does.

    Example:
        >>> scale = ReferenceScale()
        >>> for base_nll, mask in batches:
        ...     scale.update(base_nll, mask)
        >>> c_base = scale.compute()
    """

    def __init__(self) -> None:
        self._sum: torch.Tensor | None = None
        self._count: torch.Tensor | None = None

    def update(self, base_nll: torch.Tensor, mask: torch.Tensor, *, validate: bool = False) -> None:
        """Add a batch of examples.

        Args:
            base_nll: ``[B, T]`` float z-free surprisal.
            mask: ``[B, T]`` bool, True on active tokens.
            validate: check finiteness and sign of b on active tokens (a host sync).

        Raises:
            ValueError: shapes, dtypes or (with ``validate``) values are invalid.
        """
        check_pair(base_nll, mask)
        if validate:
            check_values(base_nll, mask, None)
        b = base_nll.detach().to(torch.float64)
        n_active = mask.sum(dim=-1)
        has_active = n_active > 0
        base_uniform = torch.where(mask, b, 0.0).sum(dim=-1) / n_active.clamp_min(1)
        batch_sum = torch.where(has_active, base_uniform, 0.0).sum()
        batch_count = has_active.sum()
        if self._sum is None or self._count is None:
            self._sum, self._count = batch_sum, batch_count
        else:
            self._sum = self._sum + batch_sum.to(self._sum.device)
            self._count = self._count + batch_count.to(self._count.device)

    @property
    def count(self) -> int:
        """Number of examples with an active token seen so far (a host sync)."""
        return 0 if self._count is None else int(self._count)

    def compute(self) -> float:
        """Return c_base as a Python float.

        Raises:
            ValueError: no example with an active token has been seen, or the
                estimate is not positive and finite (every b was 0, or b held NaN/inf),
                since no normalized objective can use such a scale.
        """
        if self._sum is None or self._count is None or int(self._count) == 0:
            raise ValueError(
                "ReferenceScale.compute(): no example with an active token was seen; "
                "call update(base_nll, mask) with at least one non-empty row first"
            )
        value = float(self._sum) / int(self._count)
        if not math.isfinite(value) or value <= 0:
            raise ValueError(
                f"ReferenceScale.compute(): c_base = {value!r} is not positive and finite; "
                "check base_nll (all zero, or non-finite values) or pass validate=True to update()"
            )
        return value

    def merge(self, other: ReferenceScale) -> ReferenceScale:
        """Combine with another scale (e.g. from another data shard); returns self."""
        if other._sum is not None and other._count is not None:
            if self._sum is None or self._count is None:
                self._sum, self._count = other._sum.clone(), other._count.clone()
            else:
                self._sum = self._sum + other._sum.to(self._sum.device)
                self._count = self._count + other._count.to(self._count.device)
        return self

    def reset(self) -> None:
        """Forget every example seen."""
        self._sum = None
        self._count = None

    def state_dict(self) -> dict[str, float | int]:
        """A JSON-serialisable state (sum of b_u and example count)."""
        return {
            "sum_base_uniform": 0.0 if self._sum is None else float(self._sum),
            "count": self.count,
        }

    def load_state_dict(self, state: dict[str, float | int]) -> None:
        """Restore a state written by :meth:`state_dict`."""
        self._sum = torch.tensor(float(state["sum_base_uniform"]), dtype=torch.float64)
        self._count = torch.tensor(int(state["count"]), dtype=torch.int64)
