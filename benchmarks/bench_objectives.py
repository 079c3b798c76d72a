"""Forward + backward of the full raw_plus_ncc + kl stack against plain masked mean CE.

Decoder logits [64, 128, 512] -> per-token cross-entropy -> loss; the same logits,
the same backward. Goal: the full stack costs at most 1.10x plain cross-entropy on CPU.
Also a naive direct-power implementation of the same stack for comparison.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks._timing import interleaved_medians, print_ratios
from objectives import LossInputs, LossStackSpec, ReferenceScale

BATCH, LENGTH, VOCAB, LATENT = 64, 128, 512, 16


def _inputs(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(BATCH, LENGTH, VOCAB, generator=generator, requires_grad=True)
    targets = torch.randint(0, VOCAB, (BATCH, LENGTH), generator=generator)
    lengths = torch.randint(LENGTH // 2, LENGTH + 1, (BATCH,), generator=generator)
    mask = torch.arange(LENGTH).unsqueeze(0) < lengths.unsqueeze(1)
    base_nll = torch.rand(BATCH, LENGTH, generator=generator) * 6
    kl = torch.rand(BATCH, LATENT, generator=generator, requires_grad=True)
    return logits, targets, mask, base_nll, kl


def _token_nll(logits, targets):
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1), reduction="none").view(
        BATCH, LENGTH
    )


def _naive_stack(token_nll, base_nll, mask, kl, alpha, c_base):
    """Direct powers, no log space: what the library replaces."""
    m = mask.float()
    b = base_nll * m
    n = m.sum(-1)
    powered = b**alpha * m
    weights = powered / powered.sum(-1, keepdim=True)
    r_tok = (weights * token_nll * m).sum(-1)
    m_a = powered.sum(-1) / n
    m_a1 = (b ** (alpha + 1) * m).sum(-1) / n
    m_1 = b.sum(-1) / n
    kappa = m_a1 / (m_a * m_1)
    r_hat = r_tok / kappa / c_base
    return r_tok.mean() + r_hat.mean() + kl.sum(-1).clamp_min(0.1).mean()


def main() -> None:
    torch.set_num_threads(max(1, torch.get_num_threads()))
    logits, targets, mask, base_nll, kl = _inputs()
    scale = ReferenceScale()
    scale.update(base_nll, mask)
    c_base = scale.compute()
    alpha = 2.0
    stack = LossStackSpec(
        preset="raw_plus_ncc", alpha=alpha, terms={"kl": {"weight": 1.0, "options": {"free_bits": 0.1}}}
    ).build(c_base=c_base)

    def plain():
        logits.grad = None
        token_nll = _token_nll(logits, targets)
        m = mask.float()
        ((token_nll * m).sum() / m.sum()).backward()

    def full_stack():
        logits.grad = None
        kl.grad = None
        out = stack(LossInputs(_token_nll(logits, targets), base_nll, mask, kl=kl))
        out.total.backward()

    def naive():
        logits.grad = None
        kl.grad = None
        _naive_stack(_token_nll(logits, targets), base_nll, mask, kl, alpha, c_base).backward()

    medians = interleaved_medians(
        {"plain masked mean CE": plain, "raw_plus_ncc + kl (library)": full_stack, "naive powers": naive},
        repeats=40,
    )
    print_ratios(
        f"objectives: fwd+bwd from logits [{BATCH}, {LENGTH}, {VOCAB}] "
        f"({torch.get_num_threads()} threads)",
        medians,
        baseline="plain masked mean CE",
        goal=1.10,
    )
    library, naive_seconds = medians["raw_plus_ncc + kl (library)"], medians["naive powers"]
    print(f"  library / naive powers: {library / naive_seconds:.3f}x")


if __name__ == "__main__":
    main()
