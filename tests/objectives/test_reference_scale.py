"""ReferenceScale: c_base = E_D[b_u], the mean over examples of each example's own token mean."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from objectives import ReferenceScale


def _rows(rows: list[list[float]], dtype=torch.float64, pad: float = float("nan")):
    width = max(1, max(len(r) for r in rows))
    base = torch.full((len(rows), width), pad, dtype=dtype)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, r in enumerate(rows):
        if r:
            base[i, : len(r)] = torch.tensor(r, dtype=dtype)
            mask[i, : len(r)] = True
    return base, mask


def test_mean_over_examples_not_pooled_tokens():
    # Example means 1 and 5: c_base = 3. The pooled token mean would be (4 * 1 + 5) / 5 = 1.8.
    base, mask = _rows([[1.0, 1.0, 1.0, 1.0], [5.0]])
    scale = ReferenceScale()
    scale.update(base, mask)
    assert scale.compute() == pytest.approx(3.0, rel=1e-12)
    assert scale.compute() != pytest.approx(1.8)


def test_skips_empty_rows():
    base, mask = _rows([[2.0, 4.0], [], [6.0], []], pad=float("inf"))
    scale = ReferenceScale()
    scale.update(base, mask)
    assert scale.compute() == pytest.approx((3.0 + 6.0) / 2, rel=1e-12)


def test_off_mask_entries_are_ignored():
    base, mask = _rows([[2.0, 4.0], [6.0]])
    dirty = torch.where(mask, base, torch.tensor([[float("nan"), -5.0]], dtype=torch.float64))
    a, b = ReferenceScale(), ReferenceScale()
    a.update(torch.where(mask, base, 0.0), mask)
    b.update(dirty, mask)
    assert a.compute() == b.compute() == pytest.approx(4.5, rel=1e-12)


def test_compute_raises_without_data():
    with pytest.raises(ValueError):
        ReferenceScale().compute()
    scale = ReferenceScale()
    base, mask = _rows([[], []])
    scale.update(base, mask)
    with pytest.raises(ValueError):
        scale.compute()


def test_streams_over_batches_of_different_shapes():
    first = _rows([[1.0, 2.0, 3.0], [10.0]])  # means 2, 10
    second = _rows([[4.0], [], [0.0, 8.0, 1.0, 3.0, 3.0]])  # means 4, 3
    third = _rows([[7.0, 7.0]], dtype=torch.float32)  # mean 7
    scale = ReferenceScale()
    for base, mask in (first, second, third):
        scale.update(base, mask)
    assert scale.compute() == pytest.approx((2 + 10 + 4 + 3 + 7) / 5, rel=1e-12)
    assert isinstance(scale.compute(), float)


def test_tiny_surprisals_float32():
    base, mask = _rows([[1e-25, 3e-25], [1e-30]], dtype=torch.float32)
    scale = ReferenceScale()
    scale.update(base, mask)
    expected = (float(base[0, 0]) + float(base[0, 1])) / 4 + float(base[1, 0]) / 2
    assert scale.compute() == pytest.approx(expected, rel=1e-6)


def test_merge_equals_single_stream():
    batches = [_rows([[1.0, 3.0], [9.0]]), _rows([[2.0, 2.0, 5.0]]), _rows([[], [4.0, 0.0]])]
    whole = ReferenceScale()
    for base, mask in batches:
        whole.update(base, mask)
    left, right = ReferenceScale(), ReferenceScale()
    left.update(*batches[0])
    right.update(*batches[1])
    right.update(*batches[2])
    left.merge(right)
    assert left.compute() == pytest.approx(whole.compute(), rel=1e-12)
    # Merging into an empty scale, and merging an empty one, are both fine.
    empty = ReferenceScale()
    empty.merge(whole)
    assert empty.compute() == pytest.approx(whole.compute(), rel=1e-12)
    whole_value = whole.compute()
    whole.merge(ReferenceScale())
    assert whole.compute() == pytest.approx(whole_value, rel=1e-12)


def test_state_dict_round_trip():
    scale = ReferenceScale()
    scale.update(*_rows([[1.0, 3.0], [9.0], []]))
    state = json.loads(json.dumps(scale.state_dict()))
    restored = ReferenceScale()
    restored.load_state_dict(state)
    assert restored.compute() == pytest.approx(scale.compute(), rel=1e-15)
    # Continuing after a restore is the same as never having stopped.
    more = _rows([[4.0, 4.0, 10.0]])
    scale.update(*more)
    restored.update(*more)
    assert restored.compute() == pytest.approx(scale.compute(), rel=1e-15)
    assert restored.compute() == pytest.approx((2 + 9 + 6) / 3, rel=1e-12)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.lists(
        st.lists(
            st.lists(st.floats(0.0, 100.0, allow_subnormal=False), min_size=0, max_size=12),
            min_size=1,
            max_size=6,
        ),
        min_size=1,
        max_size=4,
    )
)
def test_matches_reference_mean_of_example_means(ref, data):
    batches = [_rows(rows) for rows in data]
    means = [math.fsum(r) / len(r) for rows in data for r in rows if r]
    assume(means and math.fsum(means) > 0)
    scale = ReferenceScale()
    for base, mask in batches:
        scale.update(base, mask)
    assert scale.compute() == pytest.approx(ref.c_base(batches), rel=1e-9)
    assert scale.compute() == pytest.approx(math.fsum(means) / len(means), rel=1e-9)
