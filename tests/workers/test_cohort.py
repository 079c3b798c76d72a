"""Cohorts: a member trained in a cohort is the same trial trained alone, step for step."""

import math
import re
from pathlib import Path

import pytest
import torch

from objectives import LossStackSpec
from tests.support.mlflow_store import sqlite_store_uri
from workers.cohort.chunked import run_cohort
from workers.cohort.grouping import cohort_key, group_cohorts
from workers.cohort.trainer import Cohort, check_cohort
from workers.contract import TRAIN_KL_MULTIPLIER, TRAIN_KL_TRAIN_TARGET
from workers.train import Trainer, TrialConfig, load_trial_config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "workers" / "examples"
KL = {"kl": {"weight": 0.5, "options": {"free_bits": 0.3}}}


def base_config(family: str, epochs: int = 2, **model) -> TrialConfig:
    config = load_trial_config(EXAMPLES / f"{family}.yaml")
    return config.model_copy(update={
        "data": config.data.model_copy(update={"train_size": 80, "val_size": 32}),
        "model": config.model.model_copy(update={"embedding_dim": 8, "hidden_dim": 12, **model}),
        "training": config.training.model_copy(update={"epochs": epochs, "batch_size": 24,
                                                       "device": "cpu"}),
    })


def variant(config: TrialConfig, seed: int, stack: dict, lr: float, **training) -> TrialConfig:
    return config.model_copy(update={
        "seed": seed, "loss_stack": LossStackSpec.model_validate(stack),
        "training": config.training.model_copy(update={"learning_rate": lr, **training}),
    })


def members(config: TrialConfig) -> list[TrialConfig]:
    """Different alpha, stacks (with and without KL / bag of words / annealing), beta, free bits, lr,
    weight decay, clipping, seed; a per-token KL and a warm-up relative to the run."""
    return [
        variant(config, 0, {"preset": "raw_plus_ncc", "alpha": 1.0, "terms": KL}, 3e-3),
        variant(config, 1, {"preset": "uniform", "alpha": 0.0}, 1e-2, weight_decay=0.1),
        variant(config, 2, {"preset": "ncc", "alpha": 2.0, "terms": {
            "kl": {"weight": 1.0, "options": {"free_bits": 0.5, "scale": "token"}},
            "bag_of_words": 0.3}}, 5e-3,
            grad_clip=None),
        variant(config, 0, {"preset": "raw_token_weighted", "alpha": 0.5, "terms": {
            "kl": {"weight": 2.0, "options": {"anneal": "linear", "warmup_fraction": 0.4}}}}, 2e-3,
            grad_clip=0.05),
    ]


def with_other_data(config: TrialConfig) -> TrialConfig:
    """Another sample of the same task shapes (a member with its own data)."""
    return config.model_copy(update={"data": config.data.model_copy(update={"seed": 7})})


def lone_run(config: TrialConfig, cache: Path) -> tuple[Trainer, list[float]]:
    """The existing trainer, alone, recording every optimisation step's loss."""
    trainer = Trainer.create(config, cache)
    losses: list[float] = []
    stacks = trainer.loss_stacks

    def recording():
        stack, diagnostics = stacks()

        def call(inputs):
            out = stack(inputs)
            if torch.is_grad_enabled():
                losses.append(float(out.total.detach()))
            return out
        return call, diagnostics

    trainer.loss_stacks = recording  # type: ignore[method-assign]
    trainer.run()
    return trainer, losses


@pytest.mark.parametrize("family,model", [
    ("discrete", {}), ("continuous", {}),
    ("discrete", {"discrete_estimator": "gumbel", "num_layers": 2, "gumbel_anneal_fraction": 0.5}),
])
def test_members_match_lone_trials_in_float64(family, model, float64, tmp_path):
    configs = members(base_config(family, **model))
    configs[3] = with_other_data(configs[3])
    cohort = Cohort.create(configs, tmp_path)
    assert cohort.params["embedding.weight"].dtype == torch.float64
    assert cohort._source.tolist() == [0, 0, 0, 1]  # one stacked copy per distinct train split
    result = cohort.run()
    for member, config in zip(result, configs, strict=True):
        assert member.status == "finished", member.error
        lone, losses = lone_run(config, tmp_path)
        assert len(member.step_losses) == len(losses) == 2 * math.ceil(80 / 24)
        for step, (mine, theirs) in enumerate(zip(member.step_losses, losses, strict=True)):
            assert abs(mine - theirs) <= 1e-9, (member.position, step, mine, theirs)
        assert member.trainer.history.keys() - {"perf/cohort_size"} == lone.history.keys()
        for key, values in lone.history.items():
            if key.startswith("perf/"):
                continue
            # Read-outs may pass through float32 (e.g. posterior probabilities); losses may not.
            tolerance = {"abs": 1e-9} if key.endswith("/loss") else {"abs": 1e-9, "rel": 1e-6}
            assert member.trainer.history[key] == pytest.approx(values, nan_ok=True, **tolerance), key
        for (name, mine), theirs in zip(member.trainer.model.named_parameters(),
                                        lone.model.parameters(), strict=True):
            assert torch.allclose(mine, theirs, atol=1e-9, rtol=0), name
    # The members really differ (different seeds, stacks and rates).
    assert len({round(m.step_losses[-1], 6) for m in result}) == len(configs)


@pytest.mark.parametrize("estimator,target_encoder", [
    ("enumerate", "forward"), ("gumbel", "forward"), ("enumerate", "bidirectional")])
def test_mutual_info_credit_members_match_lone_trials(estimator, target_encoder, float64, tmp_path):
    """The KL's credit reads q, a bidirectional posterior reads y both ways, R_tok / mean kappa reads
    the member's own train split: a member's steps and parameters equal its lone trial's."""
    config = base_config("discrete", discrete_estimator=estimator, prior="standard",
                         target_encoder=target_encoder)
    credit = lambda gamma, free_bits=0.0: {"kl": {"weight": 0.5, "options": {  # noqa: E731
        "mutual_info_credit": gamma, "free_bits": free_bits}}}
    configs = [variant(config, 0, {"preset": "uniform", "terms": credit(1.0)}, 3e-3),
               variant(config, 1, {"preset": "ncc", "alpha": 1.0, "terms": credit(0.5, 0.2)}, 5e-3),
               variant(config, 2, {"preset": "uniform", "terms": credit(0.0)}, 3e-3),
               variant(config, 3, {"preset": "train_kappa_corrected", "alpha": 2.0, "terms": credit(0.0)}, 3e-3)]
    result = Cohort.create(configs, tmp_path).run()
    lead = result[3].trainer
    assert lead.train_kappa(configs[3].loss_stack) == {2.0: pytest.approx(
        float(lead.kappa_values["train"].mean()), rel=1e-12)}
    for member, config in zip(result, configs, strict=True):
        assert member.status == "finished", member.error
        lone, losses = lone_run(config, tmp_path)
        assert member.step_losses == pytest.approx(losses, abs=1e-9, rel=0)
        for (name, mine), theirs in zip(member.trainer.model.named_parameters(),
                                        lone.model.parameters(), strict=True):
            assert torch.allclose(mine, theirs, atol=1e-9, rtol=0), name
    assert len({round(m.step_losses[-1], 6) for m in result}) == len(configs)


def test_rate_controlled_members_match_lone_trials_each_with_its_own_multiplier(float64, tmp_path):
    """Two members of one stack (one vmapped group) keep their own multiplier; another target and
    an uncontrolled member beside them: steps, parameters and the beta reached are the lone ones."""
    config = base_config("discrete", epochs=3, prior="standard")
    rate = lambda target, **more: {"kl": {"weight": 0.5, "options": {  # noqa: E731
        "target_rate": target, "rate_control_lr": 0.1, **more}}}
    configs = [variant(config, 0, {"preset": "uniform", "terms": rate(0.02)}, 3e-3),  # rates the
               variant(config, 1, {"preset": "uniform", "terms": rate(0.02)}, 5e-3),  # correction reads
               variant(config, 2, {"preset": "ncc", "alpha": 1.0, "terms": rate(0.5, free_bits=0.1)}, 3e-3),
               variant(config, 3, {"preset": "uniform", "terms": KL}, 3e-3)]
    cohort = Cohort.create(configs, tmp_path)
    result = cohort.run()
    betas = []
    for member, config in zip(result, configs, strict=True):
        assert member.status == "finished", member.error
        lone, losses = lone_run(config, tmp_path)
        assert member.step_losses == pytest.approx(losses, abs=1e-9, rel=0)
        mine, theirs = member.trainer.history[TRAIN_KL_MULTIPLIER], lone.history[TRAIN_KL_MULTIPLIER]
        assert mine == pytest.approx(theirs, abs=1e-12, rel=0)
        if TRAIN_KL_TRAIN_TARGET in lone.history:  # the held-out correction, member by member
            assert member.trainer.history[TRAIN_KL_TRAIN_TARGET] == pytest.approx(
                lone.history[TRAIN_KL_TRAIN_TARGET], abs=1e-12, rel=0)
        betas.append(mine[-1])
        for (name, value), other in zip(member.trainer.model.named_parameters(),
                                        lone.model.parameters(), strict=True):
            assert torch.allclose(value, other, atol=1e-9, rtol=0), name
    assert betas[3] == 0.5 and len(set(betas)) == 4  # the uncontrolled member kept its weight
    assert result[0].trainer.history[TRAIN_KL_TRAIN_TARGET][-1] != 0.02  # the correction moved it


def test_diverging_member_fails_alone_and_the_others_go_on(tmp_path):
    config = base_config("discrete", epochs=3)
    configs = members(config)[:3]
    configs[1] = configs[1].model_copy(update={
        "training": configs[1].training.model_copy(update={"inject_nan_at_step": 5})})
    result = run_cohort(configs, tmp_path)
    assert [m.status for m in result] == ["finished", "failed", "finished"]
    assert "TrialDiverged: loss became nan at step 5 (epoch 2)" in result[1].error
    assert len(result[1].trainer.history["val/loss"]) == 1  # epoch 1 done, epoch 2 failed
    for member in (result[0], result[2]):
        assert len(member.trainer.history["val/loss"]) == 3
        assert all(math.isfinite(v) for v in member.step_losses)
    # A lone run of member 0 gives the same losses: the failure did not touch it.
    lone, losses = lone_run(configs[0], tmp_path)
    assert result[0].step_losses == pytest.approx(losses, abs=1e-5)


def test_on_member_sees_each_members_epoch_as_it_ends_failures_excluded(tmp_path):
    """``run_epoch(on_member=...)`` runs once per member that finished its epoch end, in member
    order, with the metrics ``run_epoch`` returns and the status already set; a member that
    failed that epoch gets no call."""
    configs = members(base_config("discrete", epochs=2))[:3]
    configs[1] = configs[1].model_copy(update={
        "training": configs[1].training.model_copy(update={"inject_nan_at_step": 5})})
    cohort = Cohort.create(configs, tmp_path)
    for epoch in (1, 2):
        seen: list[tuple[int, str, int, dict]] = []

        def record(position: int, metrics: dict, seen: list = seen) -> None:
            member = cohort.members[position]
            seen.append((position, member.status, member.trainer.epoch, metrics))

        results = cohort.run_epoch(on_member=record)
        assert [position for position, *_ in seen] == sorted(results) == ([0, 1, 2] if epoch == 1 else [0, 2])
        assert all(metrics is results[position] and trained == epoch for position, _, trained, metrics in seen)
        assert [status for _, status, *_ in seen] == (["running"] * 3 if epoch == 1 else ["finished"] * 2)
    assert cohort.members[1].status == "failed"


def test_huge_learning_rate_diverges_only_that_member(tmp_path):
    configs = members(base_config("continuous", epochs=2))[:2]
    configs.append(variant(configs[0], 3, {"preset": "uniform", "alpha": 1.0, "terms": {"kl": 1.0}},
                           10.0, grad_clip=None))
    result = run_cohort(configs, tmp_path)
    assert [m.status for m in result] == ["finished", "finished", "failed"]
    assert result[2].error.startswith("TrialDiverged: loss became inf at step 1 (epoch 1)")
    assert all(math.isfinite(v) for m in result[:2] for v in m.step_losses)


def test_early_stopping_drops_members_and_the_rest_continue(tmp_path):
    configs = members(base_config("discrete", epochs=6))[:2]
    stalled = configs[1].model_copy(update={  # lr so small that val loss barely moves
        "training": configs[1].training.model_copy(update={"learning_rate": 1e-9})})
    seen = []
    cohort = Cohort.create([configs[0], stalled], tmp_path)
    result = cohort.run(patience=1, on_epoch=lambda m, e, _: seen.append((m.position, e)))
    assert result[1].status == "stopped"
    assert len(result[1].trainer.history["val/loss"]) < 6
    assert result[0].status in ("finished", "stopped")
    assert (0, len(result[0].trainer.history["val/loss"])) in seen
    # on_epoch returning True stops that member only.
    cohort = Cohort.create(configs, tmp_path)
    result = cohort.run(on_epoch=lambda m, e, _: m.position == 0 and e == 2)
    assert result[0].status == "stopped" and result[0].trainer.epoch == 2
    assert result[1].status == "finished" and result[1].trainer.epoch == 6


def test_member_checkpoint_resumes_alone_and_in_a_cohort(float64, tmp_path):
    configs = members(base_config("continuous", epochs=3))[:2]
    full = run_cohort(configs, tmp_path)
    half = Cohort.create([c.model_copy(update={"training": c.training.model_copy(
        update={"epochs": 3})}) for c in configs], tmp_path)
    half.run_epoch()
    paths = {m.position: half.save_checkpoint(m, tmp_path / f"m{m.position}.pt") for m in half.members}
    resumed = run_cohort(configs, tmp_path, checkpoints=paths)
    for a, b in zip(full, resumed, strict=True):
        assert b.trainer.history["val/loss"] == pytest.approx(a.trainer.history["val/loss"], abs=1e-9)
    lone = Trainer.create(configs[1], tmp_path)
    lone.load_checkpoint(paths[1])
    lone.run()
    assert lone.history["val/loss"] == pytest.approx(full[1].trainer.history["val/loss"], abs=1e-9)


def test_cohort_rejects_mismatched_shapes_and_groups_compatible_trials():
    config = base_config("discrete")
    other = config.model_copy(update={"model": config.model.model_copy(update={"hidden_dim": 16})})
    with pytest.raises(ValueError, match="member 1 differs"):
        check_cohort([config, other])
    dropout = config.model_copy(update={"model": config.model.model_copy(update={"dropout": 0.1})})
    with pytest.raises(ValueError, match="dropout"):
        check_cohort([config, dropout])
    same = members(config)
    assert len({cohort_key(c) for c in same}) == 1
    assert group_cohorts([*same, other, dropout], 3) == [[0, 1, 2], [3], [4], [5]]
    assert group_cohorts(same, 1) == [[0], [1], [2], [3]]


def test_gpu_trial_smoke_runs_on_cpu(capsys):
    from benchmarks import gpu_trial

    # In this process (torch is already imported here); its cohort workers are processes of their own.
    assert gpu_trial.main(cpu_smoke=True) == 0
    stdout = capsys.readouterr().out
    assert "trials/hour" in stdout
    assert "compiled vs eager" in stdout and "passed" in stdout
    assert "FLOPs (2mnk per matmul)" in stdout and "fell back" not in stdout
    shares = re.findall(r"creating the members (\d+)%, training passes (\d+)%, epoch ends and the rest (-?\d+)%",
                        stdout)
    assert len(shares) == 2 and all(99 <= sum(map(int, row)) <= 101 for row in shares), shares


def test_each_member_is_its_own_mlflow_run(tmp_path):
    from mlflow.tracking import MlflowClient

    from workers.cohort.trial import run_logged_cohort
    from workers.contract import FAILURE_TAG
    from workers.tracking.reads import metric_history

    uri = sqlite_store_uri(tmp_path)
    configs = members(base_config("discrete", epochs=2))[:3]
    configs[2] = configs[2].model_copy(update={
        "name": "nan-member",
        "training": configs[2].training.model_copy(update={"inject_nan_at_step": 4})})
    pairs = run_logged_cohort(configs, uri, "cohort-test", tmp_path,
                              tags=[{"ksweep.trial_id": f"t{i}"} for i in range(3)])
    client = MlflowClient(tracking_uri=uri)
    runs = [client.get_run(run.logger.run_id) for _, run in pairs]
    assert [r.info.status for r in runs] == ["FINISHED", "FINISHED", "FAILED"]
    assert "TrialDiverged" in runs[2].data.tags[FAILURE_TAG]
    assert [r.data.tags["ksweep.trial_id"] for r in runs] == ["t0", "t1", "t2"]
    assert [float(r.data.params["alpha"]) for r in runs] == [1.0, 0.0, 2.0]
    for (member, _), record in zip(pairs[:2], runs[:2], strict=True):
        history = metric_history(client, record.info.run_id, "val/loss")
        assert [step for step, _ in history] == [1, 2]
        assert [value for _, value in history] == pytest.approx(member.trainer.history["val/loss"])
    assert len({r.info.run_id for r in runs}) == 3
    for record in runs[:2]:  # plots=True (run_logged_cohort's default): five PNGs per member
        assert {a.path for a in client.list_artifacts(record.info.run_id, "plots")} == {
            f"plots/{name}.png" for name in ("kappa_histogram_train", "kappa_histogram_val",
                                             "kappa_histogram_test", "reconstruction_curves",
                                             "position_profiles_val")}
