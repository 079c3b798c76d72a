"""Calibration runs for the caveat task (docs/science/caveat_calibration.md).

One trial per call, without Ray or MLflow: the trial config of a sweep spec's template (or a
trial yaml) plus dotted overrides, trained for the whole epoch budget (early stopping off),
with the val loss and the val and test NMI per kind recorded every epoch. The spec's early
stopping rule (patience, min_epochs) is then replayed on the recorded val loss with the
project's own ``Selection``, so one run gives the stop and selected epoch of the rule and
what a longer budget would have shown. Settings are chosen on val NMI only; test is recorded
for the table, never read to choose.

    python scripts/calibrate_caveat.py run sweeps/examples/note_caveat.yaml \
        --label lr1e-3 --stack uniform --set template.training.learning_rate=0.001
    python scripts/calibrate_caveat.py table      # the markdown table of every recorded run
    python scripts/calibrate_caveat.py cohort sweeps/examples/note_caveat.yaml --label b03 \
        --epochs 6 --set template.training.patience=null \
        --member raw_token_weighted:1:0.3:0 --member concentration_corrected:1:0.3:0
    python scripts/calibrate_caveat.py cohort-table   # one line per recorded cohort member

``cohort`` trains many (stack, alpha, beta, seed[, free bits[, family]]) points of one task as
one cohort (workers/cohort/trainer.py: each member exactly its lone trial), which is how the
second round of calibration scanned stacks, betas and seeds at a few CPU-seconds per trial.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workers.contract import EXAMPLE_KINDS  # noqa: E402
from workers.train.config import TrialConfig  # noqa: E402
from workers.train.loop import Trainer  # noqa: E402
from workers.train.selection import Selection  # noqa: E402

RECORD = Path(__file__).resolve().parents[1] / "docs" / "science" / "caveat_calibration.jsonl"
COHORT_RECORD = RECORD.with_name("caveat_calibration_cohorts.jsonl")
GROUPS = ("all", *EXAMPLE_KINDS)


def _spec_with(path: str, overrides: list[str]):
    """The sweep spec at ``path`` with ``dotted.key=yaml_value`` overrides applied to its YAML."""
    from sweeps.spec import SweepSpec

    raw = yaml.safe_load(Path(path).read_text())
    for item in overrides:
        key, _, value = item.partition("=")
        _set(raw, key, yaml.safe_load(value))
    return SweepSpec.model_validate(raw)


def _set(tree: dict, dotted: str, value) -> None:
    *head, last = dotted.split(".")
    for key in head:
        tree = tree.setdefault(key, {})
    tree[last] = value


def trial_config(args: argparse.Namespace) -> tuple[TrialConfig, dict]:
    """The trial the sweep would run for (alpha, stack, discrete, seed) of the spec with the
    overrides applied to the spec's YAML (``template.model.dropout=0.3``,
    ``common_terms.kl.weight=0.05``); early stopping is switched off and returned apart."""
    spec = _spec_with(args.spec, args.set)
    config = spec.trial_config(args.alpha, args.stack, "discrete", args.seed)
    training = config.training
    rule = {"patience": training.patience, "min_epochs": training.min_epochs}
    config = config.model_copy(update={
        "training": training.model_copy(update={"patience": None}),
        "readouts": config.readouts.model_copy(update={"gradient_batch": 0}),
    })
    return config, rule


def replay(val_loss: list[float], patience: int | None, min_epochs: int) -> tuple[int, int]:
    """(stop epoch, selected epoch) of the early-stopping rule on a recorded val-loss curve."""
    selection, probe = Selection(patience, min_epochs, 0.0), torch.nn.Identity()
    for epoch, loss in enumerate(val_loss, start=1):
        selection.update(epoch, {"val/loss": loss}, probe)
        if selection.stopped:
            return epoch, selection.best_epoch
    return len(val_loss), selection.best_epoch


def run(args: argparse.Namespace) -> None:
    config, rule = trial_config(args)
    start, cpu0 = time.time(), resource.getrusage(resource.RUSAGE_SELF).ru_utime
    trainer = Trainer.create(config, cache_root=".ksweep")
    curves: dict[str, list[float]] = {"val_loss": []}
    while not trainer.finished:
        metrics = trainer.run_epoch()
        curves["val_loss"].append(metrics["val/loss"])
        for split in ("val", "test"):
            for group in GROUPS:
                name = f"{split}/latent_nmi" if group == "all" else f"{split}/{group}/latent_nmi"
                curves.setdefault(f"{split}_{group}", []).append(round(metrics.get(name, float("nan")), 4))
        print(trainer.epoch, f"val_loss {metrics['val/loss']:.4f}",
              " ".join(f"{g} {curves[f'val_{g}'][-1]:.2f}" for g in GROUPS), flush=True)
    stop, chosen = replay(curves["val_loss"], rule["patience"], rule["min_epochs"])
    record = {
        "label": args.label, "spec": args.spec, "overrides": args.set, "seed": args.seed,
        "stack": args.stack, "alpha": args.alpha, "rule": rule,
        "epochs": trainer.epoch, "stop_epoch": stop, "selected_epoch": chosen,
        "wall_s": round(time.time() - start, 1),
        "cpu_s": round(resource.getrusage(resource.RUSAGE_SELF).ru_utime - cpu0, 1),
        "curves": curves,
    }
    with RECORD.open("a") as handle:
        handle.write(json.dumps(record) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k != "curves"}))


COHORT_CURVES = ("val/loss", *(f"{split}/{group}latent_nmi" for split in ("val", "test")
                               for group in ("", *(f"{kind}/" for kind in EXAMPLE_KINDS))),
                 *(f"val/{kind}/kl" for kind in EXAMPLE_KINDS))


def cohort(args: argparse.Namespace) -> None:
    """Train ``--member stack:alpha:beta:seed[:free_bits[:family]]`` points as one cohort for
    ``--epochs`` (the spec's own early stopping applies unless overridden), record each."""
    from workers.cohort.chunked import run_cohort

    spec = _spec_with(args.spec, [*args.set, f"template.training.epochs={args.epochs}"])
    configs = []
    for member in args.member:
        stack, alpha, beta, seed, *rest = member.split(":")
        free_bits = float(rest[0]) if rest and rest[0] != "" else None
        family = rest[1] if len(rest) > 1 else "discrete"
        configs.append(spec.trial_config(float(alpha), stack, family, int(seed),
                                         beta=float(beta), free_bits=free_bits))
    start, cpu0 = time.time(), resource.getrusage(resource.RUSAGE_SELF).ru_utime
    members = run_cohort(configs, ".ksweep", patience=None)
    wall = time.time() - start
    cpu = resource.getrusage(resource.RUSAGE_SELF).ru_utime - cpu0
    with COHORT_RECORD.open("a") as handle:
        for member, point in zip(members, args.member, strict=True):
            history = member.trainer.history
            handle.write(json.dumps({
                "label": args.label, "spec": args.spec, "overrides": args.set, "member": point,
                "status": member.status, "epochs": len(history["val/loss"]),
                "cohort_wall_s": round(wall, 1), "cohort_cpu_s": round(cpu, 1),
                "curves": {k: [round(v, 4) for v in history.get(k, [])] for k in COHORT_CURVES},
            }) + "\n")
            nmi, kl = _last_values(history)
            print(f"{point}: {len(history['val/loss'])} epochs; last epoch val NMI prefix / "
                  f"diffuse / private {nmi}; val KL {kl}", flush=True)
    print(f"{len(members)} members: {wall:.0f} s wall, {cpu:.0f} CPU s")


def _last_values(curves: dict[str, list[float]]) -> tuple[str, str]:
    """Last-epoch val NMI and val KL per kind (prefix / diffuse / private), as text."""
    def last(key: str) -> str:
        return f"{curves[key][-1]:.2f}" if curves.get(key) else "-"

    return (" / ".join(last(f"val/{kind}/latent_nmi") for kind in EXAMPLE_KINDS),
            " / ".join(last(f"val/{kind}/kl") for kind in EXAMPLE_KINDS))


def cohort_table(_: argparse.Namespace) -> None:
    """One markdown row per recorded cohort member (values at its last epoch)."""
    print("| run | member (stack:alpha:beta:seed[:free bits[:family]]) | settings | epochs | "
          "val NMI prefix / diffuse / private | val KL prefix / diffuse / private |")
    print("| --- " * 6 + "|")
    for line in COHORT_RECORD.read_text().splitlines():
        r = json.loads(line)
        nmi, kl = _last_values(r["curves"])
        print(f"| {r['label']} | {r['member']} | {', '.join(r['overrides']) or 'as the spec'} | "
              f"{r['epochs']} | {nmi} | {kl} |")


def table(_: argparse.Namespace) -> None:
    print("| run | stack, alpha | seed | settings (over the spec) | stop / selected epoch | "
          "val NMI at selected: all / prefix / private / diffuse | best val NMI in budget "
          "(prefix / private / diffuse) | test NMI at selected: all / prefix / private / diffuse "
          "| CPU s |")
    print("| --- " * 9 + "|")
    for line in RECORD.read_text().splitlines():
        r = json.loads(line)
        c, e = r["curves"], r["selected_epoch"] - 1
        val = " / ".join(f"{c[f'val_{g}'][e]:.2f}" for g in GROUPS)
        test = " / ".join(f"{c[f'test_{g}'][e]:.2f}" for g in GROUPS)
        peak = " / ".join(f"{max(c[f'val_{g}']):.2f}" for g in EXAMPLE_KINDS)
        settings = ", ".join(r["overrides"]) or "as the spec"
        settings += f" ({r['source']})" if r.get("source") else ""
        print(f"| {r['label']} | {r['stack']}, {r['alpha']:g} | {r['seed']} | {settings} | "
              f"{r['stop_epoch']} / {r['selected_epoch']} (of {r['epochs']}) | {val} | {peak} | "
              f"{test} | {'-' if r['cpu_s'] is None else round(r['cpu_s'])} |")


def breakeven(args: argparse.Namespace) -> None:
    """Per kind and stack: the value of z carrying s fully, over log K (a break-even beta).

    At the z-free optimum l_t = b_t; with z = s the decoder can reach l_t = h_t, so the
    stack's value falls by sum_t w_t (b_t - h_t), with w = 1/n (uniform), pi (R_tok) or
    pi / kappa (R~). A one-hot q(z | x, y) against a uniform prior costs beta log K of KL
    (free bits aside), so carrying s pays on a kind only for beta below this ratio.
    """
    from objectives import token_weight_stats
    from workers.data import KINDS, generate_split, oracle_base_nll, oracle_conditional_nll

    args.alpha, args.stack, args.seed = 1.0, "uniform", 0
    config, _ = trial_config(args)
    task = config.resolved_data()
    split = generate_split(task, "val")
    b = oracle_base_nll(task, split, dtype=torch.float64)
    h = oracle_conditional_nll(task, split, dtype=torch.float64)
    log_k = torch.log(torch.tensor(float(task.num_strategies), dtype=torch.float64))
    print(f"alpha | stack | {' | '.join(KINDS)}  (beta*: mean sum_t w_t (b_t - h_t) / log K)")
    for alpha in args.alphas:
        stats = token_weight_stats(b, split.mask, alpha)
        uniform = split.mask.double() / split.mask.sum(-1, keepdim=True)
        for name, w in (("uniform", uniform), ("R_tok", stats.weights),
                        ("R~", stats.weights / stats.kappa[:, None])):
            gain = (w * (b - h)).sum(-1) / log_k
            cells = [f"{float(gain[split.kind == KINDS.index(k)].mean()):.3f}" for k in KINDS]
            print(f"{alpha:g} | {name} | {' | '.join(cells)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("run")
    one.add_argument("spec")
    one.add_argument("--label", required=True)
    one.add_argument("--seed", type=int, default=0)
    one.add_argument("--alpha", type=float, default=1.0)
    one.add_argument("--stack", default="raw_token_weighted", help="a loss_stacks label of the spec")
    one.add_argument("--set", action="append", default=[], help="dotted.key=yaml_value")
    one.set_defaults(func=run)
    sub.add_parser("table").set_defaults(func=table)
    many = sub.add_parser("cohort")
    many.add_argument("spec")
    many.add_argument("--label", required=True)
    many.add_argument("--epochs", type=int, default=6)
    many.add_argument("--member", action="append", required=True,
                      help="stack:alpha:beta:seed[:free_bits[:family]] (a loss_stacks label)")
    many.add_argument("--set", action="append", default=[], help="dotted.key=yaml_value")
    many.set_defaults(func=cohort)
    sub.add_parser("cohort-table").set_defaults(func=cohort_table)
    even = sub.add_parser("breakeven")
    even.add_argument("spec")
    even.add_argument("--alphas", type=float, nargs="+", default=[1.0, 2.0])
    even.add_argument("--set", action="append", default=[], help="dotted.key=yaml_value")
    even.set_defaults(func=breakeven)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
