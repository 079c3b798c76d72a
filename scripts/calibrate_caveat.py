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
GROUPS = ("all", *EXAMPLE_KINDS)


def _set(tree: dict, dotted: str, value) -> None:
    *head, last = dotted.split(".")
    for key in head:
        tree = tree.setdefault(key, {})
    tree[last] = value


def trial_config(args: argparse.Namespace) -> tuple[TrialConfig, dict]:
    """The trial the sweep would run for (alpha, stack, discrete, seed) of the spec with the
    overrides applied to the spec's YAML (``template.model.dropout=0.3``,
    ``common_terms.kl.weight=0.05``); early stopping is switched off and returned apart."""
    from sweeps.spec import SweepSpec

    raw = yaml.safe_load(Path(args.spec).read_text())
    for item in args.set:
        key, _, value = item.partition("=")
        _set(raw, key, yaml.safe_load(value))
    spec = SweepSpec.model_validate(raw)
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
    even = sub.add_parser("breakeven")
    even.add_argument("spec")
    even.add_argument("--alphas", type=float, nargs="+", default=[1.0, 2.0])
    even.add_argument("--set", action="append", default=[], help="dotted.key=yaml_value")
    even.set_defaults(func=breakeven)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
