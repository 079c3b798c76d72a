"""The same sweep under two builds of CPython 3.11: what the interpreter's build costs.

Each base interpreter (``--python``, given twice; by default ``python3.11`` on PATH and
Debian's ``/usr/bin/python3.11`` where they differ) gets a throw-away venv without pip whose
``.pth`` names this venv's site-packages, so every build runs the very same packages and code.
Then, whole processes alternating A B B A: the imports a trial worker makes (torch, Ray Tune,
MLflow) and one small cohort sweep by ``python -m ksweep.cli sweep run`` (its Ray workers and
agents run under the same interpreter). CPU: the whole machine's (``/proc/stat``), so run it on
an idle machine. Printed: each build's median wall and CPU, and the second's CPU over the first's.

    python -m benchmarks.bench_interpreter [--python PATH --python PATH] [--rounds R]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from benchmarks.bench_member_overhead import ROOT, print_medians, sweep_env, write_spec
from benchmarks.machine_cpu import run_measured

DEBIAN = Path("/usr/bin/python3.11")
IMPORTS = "import torch, ray.tune, mlflow"


def default_interpreters() -> list[Path]:
    """The CPython 3.11 builds here, each once: ``python3.11`` on PATH (through a pyenv shim too),
    Debian's, and this venv's own base."""
    found: list[Path] = []
    for command in ("python3.11", str(DEBIAN), getattr(sys, "_base_executable", sys.executable)):
        if not shutil.which(command):
            continue
        done = subprocess.run([command, "-c", "import sys; print(getattr(sys, '_base_executable', sys.executable))"],
                              capture_output=True, text=True)
        real = Path(done.stdout.strip()).resolve() if done.returncode == 0 else None
        if real is not None and real not in found:
            found.append(real)
    return found


def describe(python: Path) -> str:
    """Its version, and whether the binary loads libpython as a shared library (``ldd``)."""
    version = subprocess.run([str(python), "-c", "import platform; print(platform.python_version())"],
                             capture_output=True, text=True, check=True).stdout.strip()
    linked = subprocess.run(["ldd", str(python)], capture_output=True, text=True).stdout
    return f"{python} {version}, " + ("loads libpython.so" if "libpython" in linked else "libpython linked in")


def venv_over_this_one(python: Path, folder: Path) -> Path:
    """A venv of ``python`` without pip that sees this venv's packages (same minor version)."""
    subprocess.run([str(python), "-m", "venv", "--without-pip", str(folder)], check=True)
    site = subprocess.run([str(folder / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    ours = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    Path(site, "this_venv.pth").write_text("\n".join(sorted(ours)) + "\n")
    return folder / "bin" / "python"


def main(interpreters: list[Path] | None = None, rounds: int = 2, members: int = 3, epochs: int = 4) -> dict[str, float]:
    interpreters = interpreters or default_interpreters()
    if len(interpreters) < 2:
        print("\n== interpreters: only one CPython 3.11 build here; nothing to compare")
        return {}
    first, second = interpreters[:2]
    with tempfile.TemporaryDirectory(prefix="bench-interpreter-") as tmp:
        root = Path(tmp)
        pythons = {name: venv_over_this_one(base, root / f"venv-{name}") for name, base in (("A", first), ("B", second))}
        spec = write_spec(root / "spec.yaml", members, epochs, 256)
        base_env = sweep_env(root)
        base_env.pop("RAY_ADDRESS", None)
        samples: dict[str, list[tuple[float, float]]] = {f"{k} {what}": [] for k in pythons for what in ("imports", "sweep")}

        def one(name: str, tag: str) -> None:
            python = str(pythons[name])
            samples[f"{name} imports"].append(run_measured([python, "-c", IMPORTS], base_env, ROOT))
            env = base_env | {"KSWEEP_SWEEP_ROOT": str(root / f"sweeps-{name}-{tag}")}
            samples[f"{name} sweep"].append(run_measured(
                [python, "-m", "ksweep.cli", "sweep", "run", str(spec), "--num-cpus", "2"], env, ROOT))

        one("A", "warm-up")  # cold caches: not counted
        for values in samples.values():
            values.clear()
        for index in range(rounds):
            for name in ("A", "B", "B", "A"):
                one(name, f"{index}-{len(samples[f'{name} sweep'])}")
    print(f"\n== one venv's packages under two interpreters, A B B A x {rounds}; a cohort of {members}, "
          f"{epochs} epochs\n  A: {describe(first)}\n  B: {describe(second)}")
    medians = print_medians(samples)
    ratios = {what: medians[f"B {what}"][1] / medians[f"A {what}"][1] for what in ("imports", "sweep")}
    print("  CPU, B over A: " + ", ".join(f"{what} {ratio:.2f}" for what, ratio in ratios.items()))
    return ratios


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", type=Path, action="append", help="a base interpreter (give two)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    main(args.python, args.rounds)
