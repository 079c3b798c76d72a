"""The performance benchmarks run and print what they claim (tiny sizes; figures not asserted)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.bench_member_overhead import member_and_fixed_cost, write_spec
from benchmarks.cohort_profile import PHASES, PhaseTimer, profile, table
from benchmarks.sweep_timeline import DRIVER

ROOT = Path(__file__).resolve().parents[2]


def test_phase_timer_charges_nested_phases_to_themselves_only():
    timer = PhaseTimer()
    started = time.perf_counter()
    with timer.phase("train pass"):
        time.sleep(0.05)
        with timer.phase("logging"):
            time.sleep(0.1)
    total = time.perf_counter() - started
    assert timer.wall["logging"] >= 0.1 and timer.wall["train pass"] >= 0.05
    # The inner phase is not counted twice: the two add up to the outer phase's wall.
    assert timer.wall["train pass"] + timer.wall["logging"] <= total
    assert timer.wall["train pass"] <= total - 0.1


def test_cohort_profile_times_every_phase_and_restores_the_library(tmp_path):
    from workers.cohort import evaluation
    from workers.cohort import trainer as cohort_trainer
    from workers.cohort.trainer import Cohort
    from workers.train import loop

    def library():
        return (Cohort._train_pass, loop.Trainer.evaluate_split, loop.collect, evaluation.collect_members,
                cohort_trainer.member_gradient_shares)

    originals = library()
    timer, wall, cpu = profile(2, tmp_path, epochs=1, train_size=64, batched=True)
    assert library() == originals
    for phase in ("create", "mlflow start", "train pass", "eval forward", "eval read-outs", "gradient shares",
                  "logging", "checkpoints", "plots + close"):
        assert timer.wall[phase] > 0, phase
    assert sum(timer.wall.values()) <= wall + 1e-6
    lines = table(2, timer, wall, cpu, "test")
    assert len(lines) == 2 + len(PHASES) + 1 and lines[-1].lstrip().startswith("other")


def test_bare_cohort_loop_trains_the_specs_trials(tmp_path):
    spec = write_spec(tmp_path / "spec.yaml", members=2, epochs=1, train_size=32)
    done = subprocess.run([sys.executable, "-m", "benchmarks.bench_member_overhead", "--bare", str(spec),
                           "--cache", str(tmp_path / "cache")], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert line["members"] == 2 and line["loop_wall"] > 0 and line["loop_cpu"] > 0


def test_member_and_fixed_cost_recover_a_known_line():
    # ksweep - bare = 5.7 s + 0.069 s per member, over three sizes, with bare walls that vary
    results = {size: {"bare_wall": 0.2 * size + 2.0, "ksweep_wall": 0.2 * size + 2.0 + 5.7 + 0.069 * size}
               for size in (16, 64, 256)}
    per_member, fixed = member_and_fixed_cost(results)
    assert per_member == pytest.approx(0.069, abs=1e-12) and fixed == pytest.approx(5.7, abs=1e-10)


@pytest.mark.parametrize("members", [0, -1])
def test_member_overhead_spec_refuses_no_members(members, tmp_path):
    from pydantic import ValidationError

    from sweeps.spec import load_sweep_spec

    with pytest.raises(ValidationError):
        load_sweep_spec(write_spec(tmp_path / "spec.yaml", members, 1, 32))


def test_one_checkpoint_file_per_cohort_holds_each_members_own_state(tmp_path):
    import torch

    from benchmarks.bench_checkpoints import checkpoint_writers, same_states
    from benchmarks.bench_cohort import sweep_configs
    from workers.cohort.grouping import cohort_key
    from workers.cohort.trainer import Cohort

    configs = [c.model_copy(update={"data": c.data.model_copy(update={"val_size": 32})})
               for c in sweep_configs(3, epochs=1, train_size=64)]
    assert len({cohort_key(c) for c in configs}) == 1 and len({c.name for c in configs}) == 3
    cohort = Cohort.create(configs, tmp_path / "cache")
    cohort.run_epoch()
    for write in checkpoint_writers(cohort, tmp_path).values():
        write()
    assert same_states(tmp_path, 3)
    # A tampered member no longer matches: the check can fail.
    states = torch.load(tmp_path / "members.pt", weights_only=False)
    states[1]["step"] += 1
    torch.save(states, tmp_path / "members.pt")
    assert not same_states(tmp_path, 3)


def test_sweep_profile_times_a_phase_whose_module_the_trial_has_not_imported_yet():
    import sys

    from benchmarks import sweep_profile

    sys.modules.pop("colorsys", None)  # as the training stack before a slot's first trial
    spec = (("colorsys", "rgb_to_hsv", "a phase"),)
    try:
        sweep_profile._instrument(spec)
        sweep_profile._state.phases = {}
        assert sys.modules["colorsys"].rgb_to_hsv(1.0, 0.0, 0.0) == (0.0, 1.0, 1.0)
        assert sweep_profile._state.phases["a phase"] > 0
    finally:
        sweep_profile._state.phases = None
        sweep_profile._patched.discard(("colorsys", "rgb_to_hsv"))
        sys.modules.pop("colorsys", None)  # the patched copy goes: a later import is the original


def test_the_headline_floor_trains_every_cohort_of_the_plan_by_the_bare_loop(tmp_path):
    from benchmarks.bench_headline import _floor_run, _write, headline_spec
    from sweeps.plan.build import build_plan
    from sweeps.spec import SweepSpec

    data = headline_spec(short=True).model_dump(mode="json")
    data["template"]["data"].update(train_size=32, val_size=16, test_size=16)
    data["template"]["training"].update(epochs=1, min_epochs=1)
    spec = SweepSpec.model_validate(data)
    plan = build_plan(spec)
    assert len(plan.cohorts) == 2 and plan.max_concurrent == 2
    wall, loop, members = _floor_run(_write(spec, tmp_path / "spec.yaml"), plan, tmp_path / "floor")
    assert members == plan.trial_count == 12
    assert 0 < loop < wall



def test_the_cohort_floor_times_a_lone_trials_training_steps_and_nothing_else(tmp_path, monkeypatch):
    from benchmarks.bench_cohort import sweep_configs, training_floor
    from workers.train import Trainer

    def no_evaluation(self):
        raise AssertionError("the floor must not evaluate")

    monkeypatch.setattr(Trainer, "evaluate", no_evaluation)
    config = sweep_configs(1, epochs=2, train_size=96, device="cpu")[0]
    wall, cpu, steps = training_floor(config, tmp_path)
    assert steps == 2 * 2  # 2 epochs of 96 examples in batches of 64
    assert wall > 0 and cpu > 0


def test_the_readouts_benchmark_checks_both_paths_agree_and_restores_the_library(capsys):
    """``bench_readouts`` raises unless today's read-outs equal the library calls' (abs 1e-9) in
    both families, prints both medians, and leaves the read-out functions as it found them."""
    from benchmarks import bench_readouts
    from workers.readouts import latent
    from workers.readouts import recovery as metrics

    before = (metrics.chance_readouts, latent._rank_correlation, metrics.gaussian_mutual_information)
    bench_readouts.main(["--members", "2", "--repeats", "1"])
    printed = capsys.readouterr().out
    assert printed.count("reference") == 2 and printed.count("current") == 2
    assert "(continuous;" in printed and "(discrete;" in printed
    assert (metrics.chance_readouts, latent._rank_correlation, metrics.gaussian_mutual_information) == before


def test_the_sweep_timeline_names_each_process_by_its_program_not_its_arguments():
    from benchmarks.sweep_timeline import _name

    raylet = ["/venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet",
              "--python_worker_command=/venv/bin/python .../ray/_private/workers/default_worker.py"]
    assert _name(raylet) == "Ray raylet"
    assert _name(["/venv/bin/python", "/venv/lib/ray/_private/workers/default_worker.py",
                  "--raylet-name=/tmp/raylet"]) == "Ray worker (the trial actor)"
    assert _name(["ray::ImplicitFunc.train"]) == "Ray worker (the trial actor)"
    assert _name(["/venv/bin/python3", "-m", "workers.tracking.writer_process"]) == "the cohort's metric writer"
    assert _name(["/venv/bin/python", "-u", "/venv/lib/ray/dashboard/agent.py", "--gcs-address=x"]) \
        == "Ray dashboard agent"
    assert _name(["/bin/sh", "-c", "true"]) is None


def test_the_sweep_timeline_names_a_fork_only_once_it_has_execd():
    """A child between its fork and its exec still shows its parent's command line: named then,
    a Ray worker the raylet forks would be counted as a second raylet (it once was)."""
    import psutil

    from benchmarks.sweep_timeline import _exec_name, _name

    # A stand-in raylet (its command line names one) that forks a child, which waits for a byte
    # on stdin and then execs a program the timeline names.
    raylet = ("import os, sys  # raylet\n"
              "child = os.fork()\n"
              "if child == 0:\n"
              "    sys.stdin.read(1)\n"
              "    os.execv('/bin/sleep', [sys.argv[1], '30'])\n"
              "print(child, flush=True)\n"
              "os.waitpid(child, 0)\n")
    parent = subprocess.Popen([sys.executable, "-c", raylet, "gcs_server"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        child = psutil.Process(int(parent.stdout.readline()))
        assert _name(child.cmdline()) == "Ray raylet"  # the trap: its parent's command line
        assert _exec_name(child) is None
        parent.stdin.write("x")
        parent.stdin.flush()
        deadline = time.monotonic() + 30
        while child.cmdline()[:1] != ["gcs_server"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _exec_name(child) == "Ray GCS"  # its own program, once exec'd
    finally:
        for process in psutil.Process(parent.pid).children(recursive=True):
            process.kill()
        parent.kill()
        parent.wait()


@pytest.mark.slow
def test_the_sweep_timeline_runs_a_given_spec_and_its_phases_add_up(tmp_path):
    """Phases are differences of one clock's events, so they sum to the whole sweep; a spec of
    two lone trials (not the default cohort) shows ``--spec`` times any sweep."""
    import yaml

    from benchmarks.sweep_timeline import run_timeline

    path = write_spec(tmp_path / "spec.yaml", members=1, epochs=1, train_size=64)
    spec = yaml.safe_load(path.read_text())
    spec["resources"]["cohort_size"] = 1
    path.write_text(yaml.safe_dump(spec))
    phases, cpu = run_timeline(members=0, epochs=0, train_size=0, spec_path=path)
    parts = [phases[name] for name in ("driver and Ray up", "trial worker to its members' runs",
                                       "training", "the end")]
    assert all(seconds > 0 for seconds in parts), phases
    assert abs(sum(parts) - phases["whole sweep"]) < 1e-6, phases
    # The driver imports Ray Tune and MLflow, a trial worker torch and the trainers: each costs
    # more than half a CPU-second; no process can use more CPU than the machine had.
    assert cpu[DRIVER] > 0.5 and cpu["Ray worker (the trial actor)"] > 0.5, cpu
    assert "Ray GCS" in cpu and "Ray raylet" in cpu, cpu
    assert sum(cpu.values()) <= phases["whole sweep"] * os.cpu_count() * 1.05, (cpu, phases)


def test_the_sweep_timelines_cpu_is_summed_by_process_name_largest_first():
    from benchmarks.sweep_timeline import cpu_by_name

    samples = {1: (DRIVER, 2.0), 7: ("Ray worker (the trial actor)", 1.5),
               9: ("Ray worker (the trial actor)", 1.25), 12: ("Ray GCS", 0.25)}
    assert list(cpu_by_name(samples).items()) == [
        ("Ray worker (the trial actor)", 2.75), (DRIVER, 2.0), ("Ray GCS", 0.25)]
    assert cpu_by_name({}) == {}


def test_the_interpreter_benchmark_runs_this_venvs_packages_under_a_base_interpreter(tmp_path):
    from benchmarks.bench_interpreter import default_interpreters, venv_over_this_one

    base = Path(sys._base_executable).resolve()
    found = default_interpreters()
    assert base in found and len(set(found)) == len(found)  # each build once, this one among them
    python = venv_over_this_one(base, tmp_path / "venv")
    done = subprocess.run([str(python), "-c", "import sys, yaml; print(sys.prefix); print(yaml.__file__)"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    prefix, yaml_file = done.stdout.split()
    assert Path(prefix) == tmp_path / "venv"  # its own venv, without pip ...
    assert not list((tmp_path / "venv").rglob("pip"))
    import yaml  # ... and this venv's packages, the very files
    assert Path(yaml_file) == Path(yaml.__file__)


def test_the_import_benchmark_times_a_whole_process_by_its_own_cpu():
    from benchmarks.bench_import import ROOT, run_once

    wall, cpu = run_once(ROOT, ["-c", "import json"])
    assert 0 < cpu <= wall + 0.5 and wall < 30
    busy_wall, busy_cpu = run_once(ROOT, ["-c", "sum(range(3_000_000))"])
    assert busy_cpu > cpu  # the child's own CPU, from wait4, not this process's
