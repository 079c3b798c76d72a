"""Does a preset's headline agree across disjoint seed sets? (docs/science/index.md, "The example specs").

Runs the spec once per seed set with ``ksweep sweep run`` (in-process Ray, a sqlite MLflow
store under --workdir) and prints, per set, the primary contrasts' mean differences with their
intervals and claims, then whether the verdicts (which contrasts differ, and in which
direction) are the same in every set.

    python scripts/seed_sets.py sweeps/examples/quickstart.yaml --sets 0,1,2 3,4,5 6,7,8
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:+.3f}"


def _verdict(contrast: dict) -> str:
    claim = contrast["claim"]
    return claim.split(" (")[0] if claim.startswith(("higher", "lower")) else "no difference"


def run_set(spec_path: Path, seeds: list[int], workdir: Path, num_cpus: int) -> dict:
    spec = yaml.safe_load(spec_path.read_text())
    spec["seeds"] = seeds
    sweep_id = "seeds-" + "-".join(map(str, seeds))
    path = workdir / f"{sweep_id}.yaml"
    path.write_text(yaml.safe_dump(spec))
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{workdir}/mlflow.db",
           "KSWEEP_SWEEP_ROOT": str(workdir / "root"), "RAY_ADDRESS": "",
           "PYTHONPATH": str(ROOT)}
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "ksweep.cli", "sweep", "run", str(path),
                           "--sweep-id", sweep_id, "--num-cpus", str(num_cpus)],
                          env=env, cwd=workdir, capture_output=True, text=True)
    seconds = time.monotonic() - began
    if done.returncode != 0:
        raise SystemExit(f"seed set {seeds} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    report = json.loads((workdir / "root" / sweep_id / "report.json").read_text())
    return {"seeds": seeds, "seconds": seconds, "report": report}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", type=Path)
    parser.add_argument("--sets", nargs="+", default=["0,1,2", "3,4,5", "6,7,8"])
    parser.add_argument("--num-cpus", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="ksweep-seedsets-"))
    workdir.mkdir(parents=True, exist_ok=True)
    results = [run_set(args.spec, [int(s) for s in text.split(",")], workdir, args.num_cpus)
               for text in args.sets]
    verdicts = []
    for result in results:
        primary = [c for c in result["report"]["contrasts"] if c["family"] == "primary"]
        print(f"seeds {result['seeds']} ({result['seconds']:.0f} s):")
        for c in primary:
            print(f"  {c['loss_stack']} - {c['baseline']} alpha {c['alpha']:g} {c['kind']}: "
                  f"{_num(c['mean_diff'])} [{_num(c['ci_low'])}, {_num(c['ci_high'])}] "
                  f"p_holm {_num(c['p_adjusted'])} -> {_verdict(c)}")
        verdicts.append({(c["loss_stack"], c["alpha"], c["kind"]): _verdict(c) for c in primary})
    agree = all(v == verdicts[0] for v in verdicts)
    print("headlines agree across the seed sets" if agree else "headlines DISAGREE across the seed sets")
    if args.json:
        args.json.write_text(json.dumps([{k: r[k] for k in ("seeds", "seconds")} | {
            "primary": [c for c in r["report"]["contrasts"] if c["family"] == "primary"]}
            for r in results], indent=2))
    return 0 if agree else 1


if __name__ == "__main__":
    raise SystemExit(main())
