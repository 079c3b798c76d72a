"""A cohort's per-epoch checkpoint: one file per member (today) against one file per cohort.

A cohort of K quickstart trials (:func:`benchmarks.bench_cohort.sweep_configs`) trains one
epoch; then, interleaved in one process, its checkpoint is written as the cohort trainable
writes it (each running member's lone-trainer state to ``member_{k}.pt``) and as one file
holding every member's state (``torch.save`` of a dict). Printed: both medians, the ratio and
the bytes; what a per-cohort checkpoint file would save. The one-file form is checked to
restore every member to the state its own file restores. No goal: it decides whether the
cohort trainable should change its checkpoint format.

    python -m benchmarks.bench_checkpoints [--members 16 64] [--repeats 15]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from benchmarks._timing import interleaved_medians, print_ratios
from benchmarks.bench_cohort import sweep_configs
from workers.cohort.member import own_rng
from workers.cohort.trainer import Cohort


def checkpoint_writers(cohort: Cohort, folder: Path) -> dict:
    """The two ways to write ``cohort``'s checkpoint into ``folder``, by name."""
    def per_member() -> None:
        for k, member in enumerate(cohort.members):
            cohort.save_checkpoint(member, folder / f"member_{k}.pt")

    def per_cohort() -> None:
        states = {}
        for k, member in enumerate(cohort.members):
            with own_rng(member):
                states[k] = member.trainer.state_dict()
        torch.save(states, folder / "members.pt")

    return {"one file per member (today)": per_member, "one file per cohort": per_cohort}


def same_states(folder: Path, members: int) -> bool:
    """Whether the per-cohort file holds exactly each member's own file's model, best model
    and counters."""
    together = torch.load(folder / "members.pt", weights_only=False)
    for k in range(members):
        alone, other = torch.load(folder / f"member_{k}.pt", weights_only=False), together[k]
        for a, b in ((alone["model"], other["model"]),
                     (alone["selection"]["best_model"] or {}, other["selection"]["best_model"] or {})):
            if a.keys() != b.keys() or not all(torch.equal(a[name], b[name]) for name in a):
                return False
        if (alone["epoch"], alone["step"]) != (other["epoch"], other["step"]):
            return False
    return True


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # a trial worker's one CPU
    for members in args.members:
        with tempfile.TemporaryDirectory(prefix="bench-ckpt-") as tmp:
            folder = Path(tmp)
            cohort = Cohort.create(sweep_configs(members, epochs=1), folder / "cache")
            cohort.run_epoch()
            writers = checkpoint_writers(cohort, folder)
            medians = interleaved_medians(writers, repeats=args.repeats, warmup=1)
            print_ratios(f"a cohort of {members}: its checkpoint after epoch 1 (median of "
                         f"{args.repeats})", medians, "one file per member (today)")
            sizes = sum(p.stat().st_size for p in folder.glob("member_*.pt")), (folder / "members.pt").stat().st_size
            print(f"  bytes: {sizes[0]:,} in {members} files, {sizes[1]:,} in one; "
                  f"per member {sizes[0] / members / 2**20:.2f} MiB; the same states: {same_states(folder, members)}")


if __name__ == "__main__":
    main()
