"""The members' losses in a cohort's train pass: members with one loss stack share one vmapped loss.

Each member's loss is the lone train step's (its stack at the training phase's weights, its
batch metrics), computed for all members of a group at once with ``torch.func.vmap``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from objectives import LossInputs
from objectives.rate_control import RateControl
from objectives.stack import LossStack
from workers.cohort.member import Member
from workers.models import CVAEOutput
from workers.train import phases as train_phases
from workers.train.batch_metrics import batch_metrics

LossGroup = tuple[torch.Tensor, list[int], Callable]


def group_rate_controls(active: list[Member], groups: list[LossGroup], rows: int) -> list:
    """Per loss group, ``(control, stack)``: its members' target-rate controls stacked to
    ``[members]`` and the group's training stack (whose :meth:`~objectives.stack.LossStack.kl_on`
    says when the control moves); None where the group's stack has no target rate."""
    result: list[tuple[RateControl, LossStack] | None] = []
    for _, positions, _ in groups:
        controls = [active[k].trainer.rate_control for k in positions]
        if any(c is None for c in controls):  # one stack: all of the group's members have one, or none
            result.append(None)
            continue
        lead = active[positions[0]].trainer
        stack = train_phases.training_stack(lead.build_stack(lead.config.loss_stack),
                                            lead.config.training, rows)
        result.append((RateControl.stack([c for c in controls if c is not None]), stack))
    return result


def write_back(active: list[Member], groups: list[LossGroup], controls) -> None:
    """Each member's slice of its group's stacked control back onto its trainer (epoch end)."""
    for (_, positions, _), control in zip(groups, controls, strict=True):
        for j, k in enumerate(positions):
            if control is not None:
                active[k].trainer.rate_control = control[0].member(j)


def loss_groups(active: list[Member], target_length: int, device: torch.device) -> list[LossGroup]:
    """``(index, positions, member_loss)`` per group of members with one loss stack (and c_base
    and train kappa): ``index`` their positions among ``active`` as a tensor on ``device``."""
    groups: dict[tuple, list[int]] = {}
    for k, member in enumerate(active):
        spec = member.config.loss_stack
        key = (spec.model_dump_json(), member.trainer.c_base, tuple(member.trainer.train_kappa(spec).items()))
        groups.setdefault(key, []).append(k)
    result = []
    for indices in groups.values():
        stack, diagnostics = active[indices[0]].trainer.loss_stacks()
        stack = train_phases.training_stack(stack, active[0].config.training, target_length)

        def member_loss(token_nll, base_nll, mask, kl, bow_logits, targets, step, posterior_probs,
                        kl_weight=None, stack=stack, diagnostics=diagnostics):
            """The lone train step's loss and batch metrics for one member (vmapped); ``kl_weight``:
            its target-rate multiplier (None: the configured weight)."""
            inputs = LossInputs(token_nll=token_nll, base_nll=base_nll, mask=mask, kl=kl,
                                bow_logits=bow_logits, targets=targets,
                                posterior_probs=posterior_probs, step=step, kl_weight=kl_weight)
            out = stack(inputs)
            diag_out = diagnostics(LossInputs(token_nll.detach(), base_nll, mask))
            output = CVAEOutput(token_nll, kl, bow_logits)
            values, count = batch_metrics(out, diag_out, output, mask)
            return out.total, {k: v.detach() for k, v in out.terms.items()}, values, count

        result.append((torch.tensor(indices, device=device), indices, member_loss))
    return result
