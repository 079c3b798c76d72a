"""Batched epoch ends: one eval forward for all members gives each member its lone read-outs."""

import pytest
import torch
from torch.func import stack_module_state

from tests.workers.test_cohort import base_config, members, with_other_data
from workers.cohort.evaluation import stack_splits
from workers.cohort.trainer import Cohort
from workers.models.functional import cvae_forward
from workers.train import Trainer


@pytest.mark.parametrize("family,model", [("discrete", {}), ("continuous", {}),
                                          ("discrete", {"discrete_estimator": "gumbel"})])
def test_eval_forward_matches_the_modules_eval_forward_in_float64(family, model, float64, tmp_path):
    trainers = [Trainer.create(c, tmp_path) for c in members(base_config(family, **model))[:3]]
    params, _ = stack_module_state([t.model for t in trainers])
    stacked = stack_splits([t.val_data for t in trainers])
    lead = trainers[0].model
    with torch.no_grad():
        batched = cvae_forward(params, lead.config, lead.num_categories, stacked["context"],
                               stacked["decoder_input"], stacked["target"], stacked["mask"], training=False)
        for k, trainer in enumerate(trainers):
            trainer.model.eval()
            data = trainer.val_data
            alone = trainer.model(data.split.context, data.decoder_input, data.split.target, data.split.mask)
            for name in ("token_nll", "kl", "bow_logits", "posterior_probs", "posterior_mean", "posterior_logvar"):
                theirs = getattr(alone, name)
                if theirs is None:
                    assert name not in batched, name
                    continue
                assert batched[name].dtype == torch.float64
                assert torch.allclose(batched[name][k], theirs, rtol=0, atol=1e-12), (k, name)


@pytest.mark.parametrize("family", ["discrete", "continuous"])
def test_batched_epoch_ends_match_member_by_member(family, float64, tmp_path):
    configs = members(base_config(family, epochs=2))
    configs[3] = with_other_data(configs[3])
    configs[2] = configs[2].model_copy(update={  # another read-out setting: its own batched group
        "readouts": configs[2].readouts.model_copy(update={"train_subset": 40, "test": False})})
    histories = {}
    for batched in (False, True):
        cohort = Cohort.create(configs, tmp_path)
        cohort.batched_eval = cohort.batched_gradients = batched
        histories[batched] = [m.trainer.history for m in cohort.run()]
    assert "test/loss" not in histories[True][2] and "test/loss" in histories[True][0]
    compared = 0
    for lone, batched in zip(histories[False], histories[True], strict=True):
        assert lone.keys() == batched.keys()
        for key, values in lone.items():
            if key.startswith("perf/"):
                continue
            # Both paths cast the outputs to float32 before the read-outs (as collect does).
            assert batched[key] == pytest.approx(values, nan_ok=True, abs=1e-9, rel=1e-6), key
            compared += 1
    assert compared > 4 * 50


def test_stack_splits_names_differing_shapes(tmp_path):
    config = base_config("discrete")
    other = config.model_copy(update={"data": config.data.model_copy(update={"val_size": 16})})
    datas = [Trainer.create(c, tmp_path).val_data for c in (config, other)]
    with pytest.raises(ValueError, match="evaluation splits differ in shape"):
        stack_splits(datas)


def test_collect_members_in_small_chunks_gives_the_same_outputs(tmp_path, monkeypatch):
    from workers.cohort import evaluation

    trainers = [Trainer.create(c, tmp_path) for c in members(base_config("discrete"))[:3]]
    params, _ = stack_module_state([t.model for t in trainers])
    stacked = stack_splits([t.val_data for t in trainers])
    lead = trainers[0].model
    whole = evaluation.collect_members(params, lead.config, lead.num_categories, stacked, 512, False)
    monkeypatch.setattr(evaluation, "MAX_MEMBER_ROWS", 7)  # 2 rows per member per batch
    chunked = evaluation.collect_members(params, lead.config, lead.num_categories, stacked, 512, False)
    for one, other in zip(whole, chunked, strict=True):
        assert one.token_nll.shape == other.token_nll.shape == (32, stacked["target"].shape[-1])
        for name in ("token_nll", "kl", "bow_logits", "posterior_probs"):
            assert torch.allclose(getattr(one, name), getattr(other, name), atol=1e-5, rtol=1e-5), name


@pytest.mark.parametrize("family", ["discrete", "continuous"])
def test_batched_gradient_shares_equal_each_members_lone_ones_in_float64(family, float64, tmp_path):
    from workers.cohort.evaluation import member_gradient_shares

    configs = members(base_config(family, epochs=1))
    configs.append(with_other_data(configs[0]))
    configs[3] = with_other_data(configs[3])  # its own data: its own token groups
    configs[1] = configs[1].model_copy(update={  # a smaller gradient batch: batched on its own
        "readouts": configs[1].readouts.model_copy(update={"gradient_batch": 20})})
    configs[2] = configs[2].model_copy(update={  # the read-out off: no values at all
        "readouts": configs[2].readouts.model_copy(update={"gradient_batch": 0})})
    cohort = Cohort.create(configs, tmp_path)
    cohort.run_epoch()  # trained a little: shares away from the initial point
    trainers = [m.trainer for m in cohort.members]
    batched = member_gradient_shares(cohort.params, cohort.model_config, cohort.num_categories,
                                     trainers, {})
    assert batched[2] == {}
    for k, trainer in enumerate(trainers):
        lone = trainer.gradient_readouts()
        assert batched[k].keys() == lone.keys(), k
        for key, value in lone.items():
            # Both paths cast l_t to float32 before the stack, as the lone read-out always did.
            assert batched[k][key] == pytest.approx(value, nan_ok=True, abs=1e-9, rel=1e-6), (k, key)
    assert sum(len(values) for values in batched) >= 4 * 5
