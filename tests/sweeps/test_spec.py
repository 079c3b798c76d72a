"""The sweep spec and its plan: examples, axes, contradictions, serialisation."""

import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError
from rich.console import Console

from sweeps import METRIC_NAMES, SweepPlan, SweepSpec, build_plan, load_sweep_spec, parse_sweep_spec
from sweeps.plan.build import render_plan
from workers.train import TrialConfig

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "sweeps" / "examples").glob("*.yaml"))
# Every spec the project ships, the compose smoke run's among them (its 422 was found only
# by a real run).
SHIPPED = [*EXAMPLES, ROOT / "scripts" / "compose_smoke_spec.yaml",
           ROOT / "scripts" / "compose_smoke_dataset_spec.yaml",
           ROOT / "scripts" / "cluster_faults_spec.yaml"]


def spec(**fields: Any) -> SweepSpec:
    return SweepSpec.model_validate({"name": "t", **fields})


def rejected(**fields: Any) -> str:
    """The error text plus one ``field.path: message`` line per error (from pydantic's loc)."""
    with pytest.raises(ValidationError) as caught:
        spec(**fields)
    located = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in caught.value.errors()]
    return "\n".join([str(caught.value), *located])


RANGE = {"low": 0, "high": 4}


# ---- examples and plan counts -----------------------------------------------------------------


def test_examples_exist():
    assert {p.name for p in EXAMPLES} >= {"quickstart.yaml", "alpha_grid.yaml", "optuna_asha.yaml"}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_example_validates_and_plans(path):
    loaded = load_sweep_spec(path)
    plan = build_plan(loaded)
    assert plan.trial_count == build_plan(loaded).trial_count == len(plan.trials) == plan.trials_after_dedup
    assert len(plan.rows) == plan.trials_requested
    assert plan.trials_saved_by_dedup == plan.trials_requested - plan.trial_count
    json.dumps(plan.to_dict())
    assert parse_sweep_spec(loaded.to_yaml()).canonical_json() == loaded.canonical_json()


@pytest.mark.parametrize(
    ("name", "requested", "count"),
    [
        # 3 alphas x 3 stacks x 3 seeds; per seed uniform once, R_tok and R~ at alpha 1 and 2.
        ("quickstart", 27, 3 * (1 + 2 + 2)),
        # per (beta, model, seed): uniform 1, normalized_uniform 1, R_tok 4, R~ 4, ncc 4, rpn 5.
        ("alpha_grid", 5 * 6 * 5 * 2 * 5, 19 * 5 * 2 * 5),
        # per (beta, model, seed): uniform 1, R_tok 4, R~ 4, ncc 5 (its alpha-0 twin
        # normalized_uniform is not swept), raw_plus_ncc 5.
        ("note_caveat", 5 * 5 * 2 * 2 * 5, 19 * 2 * 2 * 5),
        ("optuna_asha", 12, 12),
    ],
)
def test_example_trial_counts(name, requested, count):
    plan = build_plan(load_sweep_spec(ROOT / "sweeps" / "examples" / f"{name}.yaml"))
    assert (plan.trials_requested, plan.trial_count) == (requested, count)
    assert plan.trials_saved_by_dedup == requested - count


def test_quickstart_contents():
    quick = load_sweep_spec(ROOT / "sweeps" / "examples" / "quickstart.yaml")
    assert quick.alpha_values() == [0.0, 1.0, 2.0]
    assert quick.stack_labels() == ["uniform", "raw_token_weighted", "concentration_corrected"]
    assert quick.models == ["discrete"] and quick.seed_list() == [0, 1, 2]
    assert quick.template.training.epochs == 8 and quick.template.data.train_size == 1024
    assert (quick.primary_metric, quick.primary_mode) == ("val/latent_nmi", "max")
    plan = build_plan(quick)
    assert plan.max_concurrent == 2 and plan.total_epochs == 15 * 8
    # uniform runs once per seed and stands in its three alphas and the alpha-0 rows of R_tok, R~.
    shared = [t for t in plan.trials if t["shared_by"]]
    assert len(shared) == 3 and all(t["seed"] == s for t, s in zip(shared, [0, 1, 2], strict=True))
    assert shared[0]["shared_by"] == [
        "uniform@alpha=0", "uniform@alpha=1", "uniform@alpha=2", "raw_token_weighted@alpha=0",
        "concentration_corrected@alpha=0"]


def test_optuna_example_plan():
    plan = build_plan(load_sweep_spec(ROOT / "sweeps" / "examples" / "optuna_asha.yaml"))
    assert plan.scheduler["kind"] == "asha" and plan.scheduler["max_t"] == 8
    assert plan.search["kind"] == "optuna" and plan.epochs_per_trial == 8
    assert plan.rows[0] == {
        "alpha": "U[0, 4]", "loss_stack": "choice(raw_token_weighted|ncc|raw_plus_ncc)",
        "model": "discrete", "seed": 0, "trial": 0, "shared": False,
    }
    assert plan.trials_saved_by_dedup == 0


def test_random_count_is_samples_times_seeds():
    random = spec(alpha={"low": 0.1, "high": 4, "log": True}, search={"kind": "random", "num_samples": 5},
                  seeds=3, models=["discrete", "continuous"])
    plan = build_plan(random)
    assert build_plan(random).trial_count == plan.trial_count == len(plan.rows) == 15
    assert [row["seed"] for row in plan.rows[:3]] == [0, 1, 2]
    # The planner draws the points (seeded by search.seed): each sample once per seed.
    points = [tuple(row[k] for k in ("alpha", "loss_stack", "model")) for row in plan.rows]
    assert all(points[i] == points[i - i % 3] for i in range(15))
    assert len({p[0] for p in points}) == 5
    assert all(0.1 <= p[0] <= 4 and p[2] in ("discrete", "continuous") for p in points)
    assert [t["alpha"] for t in plan.trials] == [row["alpha"] for row in plan.rows]
    assert build_plan(random).rows == plan.rows  # deterministic
    other = random.model_dump(mode="json")
    other["search"]["seed"] = 1
    assert [r["alpha"] for r in build_plan(SweepSpec.model_validate(other)).rows] != \
        [r["alpha"] for r in plan.rows]


def test_random_draws_follow_the_ranges():
    # 200 log-uniform draws on [0.1, 10]: about half below 1 (the log midpoint); beta uniform.
    plan = build_plan(spec(alpha={"low": 0.1, "high": 10, "log": True}, beta={"low": 1, "high": 3},
                           search={"kind": "random", "num_samples": 200}, seeds=1,
                           budget={"max_trials": 1000}))
    alphas = [row["alpha"] for row in plan.rows]
    assert 70 < sum(a < 1 for a in alphas) < 130
    assert all(1 <= row["beta"] <= 3 for row in plan.rows)
    assert plan.trials[0]["beta"] == plan.rows[0]["beta"]


def test_random_sweep_runs_in_cohorts():
    random = spec(alpha=RANGE, search={"kind": "random", "num_samples": 3}, seeds=2,
                  resources={"cohort_size": 4})
    plan = build_plan(random)
    assert plan.trial_count == 6 and plan.cohorts == [[0, 1, 2, 3], [4, 5]]
    out = io.StringIO()
    render_plan(plan, Console(file=out, width=160))
    text = out.getvalue()
    assert "cohorts: 2 (cohort size 4; sizes 4, 2)" in text
    assert f"{plan.rows[0]['alpha']:g}" in text  # the drawn values are shown
    assert build_plan(spec(alpha=RANGE, search={"kind": "random", "num_samples": 3},
                           seeds=2)).cohort_size == 2  # auto: ceil(6 / 4 workers)


def test_dedup_off_runs_every_row():
    quick = load_sweep_spec(ROOT / "sweeps" / "examples" / "quickstart.yaml").model_dump(mode="json")
    quick["search"]["dedup"] = False
    plan = build_plan(SweepSpec.model_validate(quick))
    assert (plan.trials_requested, plan.trial_count, plan.trials_saved_by_dedup) == (27, 27, 0)
    assert [row["trial"] for row in plan.rows] == list(range(27))
    assert not any(row["shared"] or trial["shared_by"]
                   for row, trial in zip(plan.rows, plan.trials, strict=True))
    assert plan.trials[0] == {"alpha": 0.0, "loss_stack": "uniform", "model": "discrete",
                              "seed": 0, "shared_by": [], "total_steps": 128, "elbo_beta": "7",
                              "schedule_overruns": []}
    assert "dedup" in rejected(search={"dedup": "sometimes"})


def test_plan_resources_and_json():
    grid = spec(seeds=2, resources={"cpu": 2, "gpu": 0.25}, budget={"max_concurrent_trials": 3})
    plan = build_plan(grid)
    data = json.loads(json.dumps(plan.to_dict()))
    # 12 rows; per seed uniform once (3 alphas) and raw_plus_ncc at each alpha: 8 trials.
    assert plan.trial_count == 8 and plan.max_concurrent == 3 and plan.trials_requested == 12
    assert data["resources_per_trial"] == {"cpu": 2.0, "gpu": 0.25}
    assert data["peak_resources"] == {"cpu": 6.0, "gpu": 0.75}
    assert data["total_epochs"] == 8 * grid.template.training.epochs
    assert (data["trials_after_dedup"], data["trials_saved_by_dedup"]) == (8, 4)
    assert data["objective"] == {"metrics": ["val/latent_nmi"], "modes": ["max"]}
    # Concurrency never exceeds the number of trials.
    assert build_plan(spec(budget={"max_concurrent_trials": 100})).max_concurrent == 4
    assert build_plan(spec()).max_concurrent == 4


def test_render_plan_truncates():
    plan = build_plan(spec(alpha=[float(a) for a in range(10)], seeds=6))
    assert isinstance(plan, SweepPlan) and plan.trials_requested == 120
    assert plan.trial_count == (1 + 10) * 6
    out = io.StringIO()
    render_plan(plan, Console(file=out, width=160))
    text = out.getvalue()
    assert "... 70 more" in text and "66 trials" in text and "peak" in text
    assert "120 requested, 54 saved by dedup" in text and "(shared)" in text


# ---- the axes ---------------------------------------------------------------------------------


def test_defaults():
    default = spec()
    assert default.alpha == [0.0, 1.0, 2.0]
    assert default.stack_labels() == ["uniform", "raw_plus_ncc"]
    assert default.models == ["discrete"] and default.seed_list() == [0]
    assert build_plan(default).trial_count == 4  # uniform once, raw_plus_ncc at alphas 0, 1, 2
    assert default.beta is None and default.free_bits is None
    assert default.common_terms["kl"].weight == 1.0 and default.common_terms["kl"].options == {}
    assert default.objective_modes() == ["max"]


def test_metric_names_follow_design():
    assert len(METRIC_NAMES) == 29 and len(set(METRIC_NAMES)) == 29
    assert {"train/loss", "val/kappa_p90", "val/cv2_mean", "val/latent_ari", "val/latent_ami",
            "val/elbo", "test/elbo", "train/kl_multiplier"} <= set(METRIC_NAMES)


def test_a_dataset_spec_defaults_to_ami_and_keeps_a_metric_it_names():
    """On a dataset the unset objective and analysis metrics are AMI (max); the synthetic task
    keeps NMI; a metric the spec names is kept; the choice survives the spec's JSON dump."""
    on_data = spec(template={"data": {"dataset": "toy"}})
    assert on_data.objective.metrics == ["val/latent_ami"] and on_data.primary_mode == "max"
    assert on_data.analysis.metric == "latent_ami"
    again = SweepSpec.model_validate_json(on_data.canonical_json())
    assert again.objective.metrics == ["val/latent_ami"] and again.analysis.metric == "latent_ami"
    named = spec(template={"data": {"dataset": "toy"}}, objective={"metrics": ["val/latent_nmi"]},
                 analysis={"metric": "latent_nmi"})
    assert named.objective.metrics == ["val/latent_nmi"] and named.analysis.metric == "latent_nmi"
    synthetic = spec()
    assert synthetic.objective.metrics == ["val/latent_nmi"] and synthetic.analysis.metric == "latent_nmi"
    assert synthetic.analysis.latent_in_use_nats == 0.05
    with pytest.raises(ValidationError, match="latent_in_use_nats"):
        spec(analysis={"latent_in_use_nats": -0.1})


def test_default_modes():
    multi = spec(alpha=RANGE, search={"kind": "optuna"},
                 objective={"metrics": ["val/latent_ari", "val/recon_uniform", "val/active_units"]})
    assert multi.objective_modes() == ["max", "min", "max"]
    assert multi.primary_metric == "val/latent_ari"
    given = spec(objective={"metrics": ["val/kl"], "modes": ["max"]})
    assert given.primary_mode == "max"


def test_trial_config_applies_overrides():
    sweep = spec(template={"seed": 9, "model": {"family": "discrete", "hidden_dim": 32},
                           "training": {"epochs": 3}},
                 models=["discrete", "continuous"])
    config = sweep.trial_config(2.0, "raw_plus_ncc", "continuous", 4)
    assert isinstance(config, TrialConfig)
    assert config.alpha == 2.0 and config.loss_stack.alpha == 2.0
    assert config.loss_stack.label == "raw_plus_ncc"
    assert config.model.family == "continuous" and config.model.hidden_dim == 32
    assert config.seed == 4 and config.training.epochs == 3
    assert config.loss_stack.resolved_terms()["kl"].options == {}
    assert set(config.loss_stack.resolved_terms()) == {
        "token_weighted", "normalized_concentration_corrected", "kl"}
    assert config.name == "continuous-raw_plus_ncc-a2-s4"
    assert config.summary_params() == {
        "alpha": 2.0, "loss_stack": "raw_plus_ncc", "model": "continuous", "seed": 4}
    with pytest.raises(KeyError):
        sweep.trial_config(1.0, "ncc", "discrete", 0)


def test_stack_spec_keeps_inline_kl_over_common_terms():
    sweep = spec(loss_stacks=[
        {"name": "ncc_beta", "preset": "ncc", "terms": {"kl": {"weight": 0.25}}},
        {"name": "plain", "terms": {"uniform": 1.0}},
    ])
    own = sweep.stack_spec("ncc_beta", 0.5)
    assert own.name == "ncc_beta" and own.alpha == 0.5 and own.c_base is None
    assert own.resolved_terms()["kl"].weight == 0.25 and own.resolved_terms()["kl"].options == {}
    merged = sweep.stack_spec("plain", 1.5).resolved_terms()
    assert list(merged) == ["uniform", "kl"] and merged["kl"].options == {}


def test_empty_common_terms():
    assert set(spec(common_terms={}).stack_spec("uniform", 1.0).resolved_terms()) == {"uniform"}


def test_plan_rows_order_and_count():
    sweep = spec(alpha=[0, 1], loss_stacks=["uniform", "ncc"], models=["discrete", "continuous"],
                 seeds=[3, 5])
    plan = build_plan(sweep)
    points = [{k: row[k] for k in ("alpha", "loss_stack", "model", "seed")} for row in plan.rows]
    assert len(points) == plan.trials_requested == 16
    # per (model, seed): uniform once, ncc at alpha 0 (= normalized_uniform) and at alpha 1.
    assert build_plan(sweep).trial_count == plan.trial_count == 12
    assert points[:3] == [
        {"alpha": 0.0, "loss_stack": "uniform", "model": "discrete", "seed": 3},
        {"alpha": 0.0, "loss_stack": "uniform", "model": "discrete", "seed": 5},
        {"alpha": 1.0, "loss_stack": "uniform", "model": "discrete", "seed": 3},
    ]
    assert plan.rows[2]["trial"] == plan.rows[0]["trial"] and plan.rows[0]["shared"]
    assert points[-1] == {"alpha": 1.0, "loss_stack": "ncc", "model": "continuous", "seed": 5}
    assert plan == build_plan(sweep)
    assert len({json.dumps(p, sort_keys=True) for p in points}) == 16


def test_seed_forms():
    assert spec(seeds=3).seed_list() == [0, 1, 2]
    assert spec(seeds=[7, 2]).seed_list() == [7, 2]
    assert "seeds" in rejected(seeds=0)
    assert "seeds" in rejected(seeds=[1, 1])
    assert "seeds" in rejected(seeds=[-1])


# ---- contradictions ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["random", "optuna"])
def test_alpha_list_needs_grid(kind):
    message = rejected(alpha=[0, 1], search={"kind": kind})
    assert "alpha: a list of values is a grid; use search.kind=grid" in message
    assert "{low, high}" in message


def test_alpha_range_needs_random_or_optuna():
    assert "alpha: a range needs search.kind random or optuna" in rejected(alpha=RANGE)


def test_multi_objective_needs_optuna():
    metrics = {"metrics": ["val/latent_nmi", "val/loss"]}
    for kind, alpha in (("grid", [0.0]), ("random", RANGE)):
        message = rejected(alpha=alpha, search={"kind": kind}, objective=metrics)
        assert "objective.metrics" in message and "search.kind" in message
    message = rejected(alpha=RANGE, search={"kind": "optuna"}, scheduler={"kind": "asha"},
                       objective=metrics)
    assert "objective.metrics" in message and "scheduler.kind" in message
    nsga = spec(alpha=RANGE, search={"kind": "optuna", "sampler": "nsga2"}, objective=metrics)
    assert nsga.objective_modes() == ["max", "min"]
    assert build_plan(spec(alpha=RANGE, search={"kind": "optuna", "sampler": "nsga2"})).trial_count == 8


def test_optuna_single_seed():
    message = rejected(alpha=RANGE, search={"kind": "optuna"}, seeds=2)
    assert "seeds: optuna samples one configuration per trial; use a single seed" in message
    assert spec(alpha=RANGE, search={"kind": "optuna"}, seeds=[4]).seed_list() == [4]


def over_budget(**fields: Any) -> str:
    """The budget error of a spec that parses: one ``budget.max_trials: message`` line."""
    from sweeps.plan.budget import build_plan_within_budget

    with pytest.raises(ValidationError) as caught:
        build_plan_within_budget(spec(**fields))
    (error,) = caught.value.errors()
    return f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}"


def test_over_budget():
    from sweeps.plan.budget import build_plan_within_budget

    # 80 rows; dedup runs uniform once and raw_plus_ncc at 4 alphas per seed: 50 trials.
    message = over_budget(alpha=[0, 1, 2, 3], seeds=10, budget={"max_trials": 40})
    assert message == ("budget.max_trials: the plan has 50 trials, over budget.max_trials = 40; "
                       "raise the budget or shrink the axes")
    within = spec(alpha=[0, 1, 2, 3], seeds=10, budget={"max_trials": 50})
    assert build_plan_within_budget(within).trial_count == build_plan(within).trial_count == 50
    assert "the plan has 300 trials" in over_budget(
        alpha=RANGE, search={"kind": "random", "num_samples": 100}, seeds=3)


def test_max_t_within_epochs():
    message = rejected(template={"training": {"epochs": 5}}, scheduler={"kind": "asha", "max_t": 6})
    assert "scheduler.max_t" in message and "template.training.epochs" in message
    asha = spec(template={"training": {"epochs": 5}}, scheduler={"kind": "asha", "max_t": 4})
    assert build_plan(asha).epochs_per_trial == 4
    message = rejected(template={"training": {"epochs": 3}},
                       scheduler={"kind": "asha", "grace_period": 4})
    assert "scheduler.grace_period" in message


# ---- field validation -------------------------------------------------------------------------


def test_unknown_fields_rejected_with_path():
    assert "colour" in rejected(colour="red")
    message = rejected(template={"training": {"epochz": 3}})
    assert "template.training.epochz" in message and "Extra inputs are not permitted" in message
    assert "search.samples" in rejected(search={"samples": 3})
    assert "budget.max_trial" in rejected(budget={"max_trial": 3})


def test_trial_plots_are_off_unless_the_spec_asks_for_them():
    assert spec().tracking.trial_plots is False
    assert spec(tracking={"trial_plots": True}).tracking.trial_plots is True
    message = rejected(tracking={"trial_plot": True})
    assert "tracking.trial_plot" in message and "Extra inputs are not permitted" in message
    assert "tracking.trial_plots" in rejected(tracking={"trial_plots": "sometimes"})


def test_name_and_tags():
    with pytest.raises(ValidationError, match="name"):
        SweepSpec.model_validate({"name": "-bad name"})
    with pytest.raises(ValidationError, match="name"):
        SweepSpec.model_validate({})
    assert spec(tags={"version": 2}).tags == {"version": "2"}
    assert "tags" in rejected(tags={"bad key": "x"})
    assert "tags" in rejected(tags={f"k{i}": "v" for i in range(51)})
    assert "tags" in rejected(tags={"k": "v" * 501})


def test_unknown_preset_lists_valid_ones():
    message = rejected(loss_stacks=["uniform", "nccc"])
    assert "unknown preset 'nccc'" in message and "raw_plus_ncc" in message


def test_unknown_term_in_inline_stack():
    message = rejected(loss_stacks=[{"name": "mine", "terms": {"bogus": 1.0}}])
    assert "loss_stacks" in message and "unknown loss term 'bogus'" in message


def test_unknown_option_in_inline_stack():
    message = rejected(loss_stacks=[{"name": "mine", "terms": {"kl": {"options": {"fre_bits": 1}}}}])
    assert "fre_bits" in message


def test_inline_stack_must_not_set_alpha_or_c_base():
    message = rejected(loss_stacks=["uniform", {"name": "mine", "preset": "ncc", "alpha": 2.0}])
    assert "loss_stacks.1.alpha: alpha is swept at the sweep level; remove it" in message
    assert "loss_stacks.0.c_base" in rejected(
        loss_stacks=[{"name": "mine", "preset": "ncc", "c_base": 2.0}])


def test_inline_stack_needs_a_valid_name():
    assert "loss_stacks.0.name" in rejected(loss_stacks=[{"preset": "ncc"}])
    assert "loss_stacks.0.name" in rejected(loss_stacks=[{"name": "has space", "preset": "ncc"}])


def test_duplicate_stack_labels():
    message = rejected(loss_stacks=["ncc", {"name": "ncc", "preset": "ncc", "terms": {"kl": 0.5}}])
    assert "duplicate labels ncc" in message
    assert "duplicate" in rejected(loss_stacks=["ncc", "ncc"])


def test_alpha_values_checked():
    assert "alpha: duplicate values 1" in rejected(alpha=[0, 1, 1.0])
    assert "alpha" in rejected(alpha=[-1.0])
    assert "alpha" in rejected(alpha=[float("nan")])
    assert "alpha" in rejected(alpha=[])
    assert "alpha" in rejected(alpha=[float(a) for a in range(65)])


def test_alpha_range_checked():
    log_zero = rejected(alpha={"low": 0, "high": 4, "log": True}, search={"kind": "random"})
    assert "alpha.low" in log_zero
    assert "alpha.high" in rejected(alpha={"low": 2, "high": 1}, search={"kind": "random"})
    assert "extra" in rejected(alpha={"low": 0, "high": 1, "step": 1}, search={"kind": "random"})


def test_common_terms_validated():
    assert "bogus" in rejected(common_terms={"bogus": {"weight": 1.0}})
    assert "free_bitz" in rejected(common_terms={"kl": {"options": {"free_bitz": 1.0}}})
    assert spec(common_terms={"kl": 0.5}).common_terms["kl"].weight == 0.5


def test_models_objective_budget_resources():
    assert "models" in rejected(models=["discrete", "discrete"])
    assert "models" in rejected(models=["gaussian"])
    assert "models" in rejected(models=[])
    message = rejected(objective={"metrics": ["val/nmi"]})
    assert "unknown metric 'val/nmi'" in message and "val/latent_nmi" in message
    assert "objective.modes" in rejected(objective={"metrics": ["val/loss"], "modes": ["min", "max"]})
    assert "budget.max_trials" in rejected(budget={"max_trials": 0})
    assert "budget.time_budget_s" in rejected(budget={"time_budget_s": 0})
    assert "resources.cpu" in rejected(resources={"cpu": 0})
    assert spec(resources={"cpu": 0.5, "gpu": 0.5}).resources.gpu == 0.5
    assert "scheduler.reduction_factor" in rejected(scheduler={"reduction_factor": 1})


# ---- serialisation ----------------------------------------------------------------------------

SAMPLE = {
    "name": "sample",
    "tags": {"b": "2", "a": "1"},
    "alpha": [0, 0.5],
    "loss_stacks": ["ncc", {"name": "mine", "preset": "uniform", "terms": {"kl": {"weight": 0.5}}}],
    "common_terms": {"kl": {"options": {"free_bits": 0.5}, "weight": 1.0}},
    "template": {"training": {"epochs": 3, "batch_size": 32}, "data": {"train_size": 100}},
    "seeds": [1, 2],
}


def _reordered(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _reordered(value[key]) for key in reversed(list(value))}
    if isinstance(value, list):
        return [_reordered(item) for item in value]
    return value


def test_canonical_json_ignores_key_order():
    first = SweepSpec.model_validate(SAMPLE)
    second = SweepSpec.model_validate(_reordered(SAMPLE))
    assert first.canonical_json() == second.canonical_json()
    assert json.loads(first.canonical_json())["name"] == "sample"
    assert first.canonical_json() != spec().canonical_json()


def test_json_and_yaml_parse_equal():
    from_yaml = parse_sweep_spec(yaml.safe_dump(SAMPLE))
    from_json = parse_sweep_spec(json.dumps(SAMPLE), format="json")
    assert from_yaml == from_json
    assert from_yaml.canonical_json() == from_json.canonical_json()
    assert parse_sweep_spec(from_yaml.to_yaml()) == from_yaml


def test_canonical_json_reloads_to_the_same_trials():
    # The Tune trainable rebuilds the spec from canonical_json on the worker.
    first = SweepSpec.model_validate(SAMPLE)
    again = SweepSpec.model_validate_json(first.canonical_json())
    assert again.canonical_json() == first.canonical_json()
    for label in first.stack_labels():
        assert again.trial_config(0.5, label, "discrete", 1) == first.trial_config(
            0.5, label, "discrete", 1)


def test_load_by_suffix(tmp_path):
    (tmp_path / "s.json").write_text(json.dumps(SAMPLE))
    (tmp_path / "s.yml").write_text(yaml.safe_dump(SAMPLE))
    assert load_sweep_spec(tmp_path / "s.json") == load_sweep_spec(tmp_path / "s.yml")


def test_parse_errors():
    with pytest.raises(ValueError, match="mapping"):
        parse_sweep_spec("- a\n- b\n")
    with pytest.raises(ValueError, match="JSON"):
        parse_sweep_spec("{not json", format="json")
    with pytest.raises(ValueError, match="YAML"):
        parse_sweep_spec("name: [unclosed")


def test_dump_leaves_out_swept_template_fields():
    dumped = json.loads(spec(template={"seed": 3, "name": "ignored"}).canonical_json())
    assert {"seed", "name", "loss_stack"}.isdisjoint(dumped["template"])
    assert "family" not in dumped["template"]["model"]
    assert spec(template={"seed": 3}).canonical_json() == spec().canonical_json()


def test_json_schema_has_descriptions():
    schema = SweepSpec.model_json_schema()
    assert all("description" in field for field in schema["properties"].values())
    for name in ("AlphaRange", "BetaRange", "SearchSpec", "SchedulerSpec", "ObjectiveSpec",
                 "BudgetSpec", "ResourcesSpec", "AnalysisSpec"):
        properties = schema["$defs"][name]["properties"]
        assert all("description" in field for field in properties.values()), name


# ---- cohorts (resources.cohort_size) ----------------------------------------------------------


def test_cohort_size_defaults_to_auto_and_one_keeps_one_trial_per_worker():
    plan = build_plan(spec(seeds=2))  # 8 trials, 4 workers by default: cohorts of 2
    assert spec().resources.cohort_size == "auto"
    assert plan.cohort_size == 2 and plan.cohorts == [[0, 1], [2, 3], [4, 5], [6, 7]]
    lone = build_plan(spec(seeds=2, resources={"cohort_size": 1}))
    assert lone.cohort_size == 1 and lone.cohorts == [[i] for i in range(lone.trial_count)]


def test_cohorts_group_the_trials_and_validate_shows_them():
    # 12 rows, 8 trials; cohorts of 3: 3 + 3 + 2, every trial in exactly one.
    plan = build_plan(spec(seeds=2, resources={"cohort_size": 3}, budget={"max_concurrent_trials": 2}))
    assert plan.trial_count == 8 and plan.cohort_size == 3
    assert [len(c) for c in plan.cohorts] == [3, 3, 2]
    assert sorted(t for c in plan.cohorts for t in c) == list(range(8))
    assert plan.max_concurrent == 2  # Tune trials: cohorts
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["cohorts"] == [[0, 1, 2], [3, 4, 5], [6, 7]] and data["cohort_size"] == 3
    out = io.StringIO()
    render_plan(plan, Console(file=out, width=160))
    text = out.getvalue()
    assert "cohorts: 3 (cohort size 3; sizes 3, 3, 2)" in text
    assert "cohort 3: trials 7, 8" in text and "per cohort" in text
    assert "cohort" in text.splitlines()[2]  # the table's column


def test_cohort_size_auto_rule():
    # ceil(trials / workers): 8 trials on 2 workers -> 4; workers default to 4 -> 2.
    assert build_plan(spec(seeds=2, resources={"cohort_size": "auto"},
                           budget={"max_concurrent_trials": 2})).cohort_size == 4
    assert build_plan(spec(seeds=2, resources={"cohort_size": "auto"})).cohort_size == 2
    # capped at 32
    big = spec(seeds=100, resources={"cohort_size": "auto"}, budget={"max_concurrent_trials": 1,
                                                                     "max_trials": 1000})
    assert build_plan(big).cohort_size == 32
    # auto is the default; random search as grid; 1 for Optuna and ASHA
    assert spec().resources.cohort_size == "auto"
    assert build_plan(spec(alpha=RANGE, search={"kind": "random", "num_samples": 4}, seeds=2,
                           resources={"cohort_size": "auto"})).cohort_size == 2
    assert build_plan(spec(alpha=RANGE, search={"kind": "optuna", "num_samples": 8}, seeds=1,
                           resources={"cohort_size": "auto"})).cohort_size == 1
    assert build_plan(spec(scheduler={"kind": "asha"},
                           resources={"cohort_size": "auto"})).cohort_size == 1


def test_cohorts_keep_dropout_trials_alone():
    plan = build_plan(spec(seeds=2, resources={"cohort_size": 4},
                           template={"model": {"dropout": 0.1}}))
    assert plan.cohorts == [[i] for i in range(plan.trial_count)]


@pytest.mark.parametrize("fields", [
    {"scheduler": {"kind": "asha"}},
    {"alpha": RANGE, "search": {"kind": "optuna", "num_samples": 4}, "seeds": 1},
])
def test_cohorts_refused_where_trials_are_decided_one_by_one(fields):
    text = rejected(resources={"cohort_size": 4}, **fields)
    assert "resources.cohort_size: " in text
    assert "set resources.cohort_size: 1" in text


@pytest.mark.parametrize("value", [0, -1, "big", 1.5, 10_000])
def test_cohort_size_values_checked(value):
    assert "resources.cohort_size" in rejected(resources={"cohort_size": value})
