"""The latent's assignment against length and kappa quartiles: known answers."""

import math

import numpy as np
import torch

from workers.contract import LATENT_NMI_KAPPA, LATENT_NMI_LENGTH
from workers.readouts.confounds import confound_readouts, quartile_bins


def _mask(lengths: list[int], width: int = 12) -> torch.Tensor:
    return torch.arange(width).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)


def test_a_latent_that_sorts_by_length_reads_nmi_one_against_length():
    lengths = [2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1] * 5
    bins = quartile_bins(np.array(lengths, dtype=float))
    out = confound_readouts(torch.tensor(bins), _mask(lengths), torch.rand(len(lengths)) + 1)
    assert out[LATENT_NMI_LENGTH] == 1.0
    assert 0 <= out[LATENT_NMI_KAPPA] < 0.5


def test_a_constant_latent_reads_zero_and_a_constant_kappa_is_undefined():
    lengths = list(range(1, 13)) * 4
    out = confound_readouts(torch.zeros(len(lengths), dtype=torch.long), _mask(lengths), torch.ones(len(lengths)))
    assert out[LATENT_NMI_LENGTH] == 0.0
    assert math.isnan(out[LATENT_NMI_KAPPA])  # alpha 0: kappa = 1 for every example


def test_kappa_quartiles_are_found_and_an_empty_split_reads_nan():
    kappa = torch.linspace(1.0, 3.0, 40)
    assignment = torch.tensor(quartile_bins(kappa.numpy().astype(float)))
    out = confound_readouts(assignment, _mask([5] * 40), kappa)
    assert out[LATENT_NMI_KAPPA] == 1.0
    assert math.isnan(out[LATENT_NMI_LENGTH])  # one length: no two bins
    empty = confound_readouts(torch.zeros(0, dtype=torch.long), _mask([]), torch.zeros(0))
    assert math.isnan(empty[LATENT_NMI_LENGTH]) and math.isnan(empty[LATENT_NMI_KAPPA])


def test_ami_within_length_quartiles_on_known_latents():
    from workers.contract import LATENT_AMI_WITHIN_LENGTH

    lengths = [1, 2, 3, 4, 5, 6, 7, 8] * 10  # quartiles: lengths 1-2, 3-4, 5-6, 7-8
    label = torch.tensor([(i // 8 + i) % 2 for i in range(80)])  # both classes in every quartile
    bins = torch.tensor(quartile_bins(np.array(lengths, dtype=float)))
    kappa = torch.rand(80) + 1

    def within(z: torch.Tensor) -> float:
        return confound_readouts(z, _mask(lengths), kappa, label)[LATENT_AMI_WITHIN_LENGTH]

    assert within(label) == 1.0  # the label itself, whatever the length
    assert within(bins) == 0.0  # the length quartile: constant within each quartile
    # the label in the two short quartiles, a constant in the two long ones: (40 x 1 + 40 x 0) / 80
    half = torch.where(bins < 2, label, torch.zeros_like(label))
    assert within(half) == 0.5
    # without labels the read-out is absent; a random latent is near 0
    assert LATENT_AMI_WITHIN_LENGTH not in confound_readouts(label, _mask(lengths), kappa)
    noise = torch.randint(0, 2, (80,), generator=torch.Generator().manual_seed(0))
    assert abs(within(noise)) < 0.1
