"""Fixtures shared by the worker tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def float64():
    """torch's default dtype float64 for the test (exactness checks), restored after it."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)
