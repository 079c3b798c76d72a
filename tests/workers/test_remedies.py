"""Collapse remedies on known answers: word dropout, aggressive inference-network updates, and
autoencoder pre-training with the decoder reset, alone and in a cohort (workers/train/phases.py)."""

import math

import pytest
import torch

from objectives import LossStackSpec
from tests.workers.test_cohort import base_config, members
from workers.cohort.grouping import cohort_key, group_cohorts
from workers.cohort.trainer import Cohort
from workers.data import SyntheticTaskConfig, generate_split
from workers.models import CVAE, ModelConfig
from workers.models.backbone import word_dropout_mask
from workers.models.cvae import INFERENCE_PARAMS
from workers.models.functional import cvae_forward
from workers.train import Trainer, TrainingConfig, TrialConfig, phases
from workers.train.selection import Selection

TASK = SyntheticTaskConfig(train_size=16, val_size=8, num_strategies=3, content_vocab=6)


@pytest.fixture(scope="module")
def batch():
    split = generate_split(TASK, "train")
    return split.context, split.decoder_input(), split.target, split.mask


def model(family: str = "discrete", **fields) -> CVAE:
    torch.manual_seed(0)
    return CVAE(ModelConfig(family=family, latent_dim=5, **fields), TASK.vocab_size, TASK.num_strategies)


def scrambled(decoder_input: torch.Tensor) -> torch.Tensor:
    """Other tokens at every position after BOS."""
    other = decoder_input.clone()
    other[:, 1:] = (decoder_input[:, 1:] + 3) % TASK.vocab_size
    assert (other[:, 1:] != decoder_input[:, 1:]).all()
    return other


def with_training(config: TrialConfig, **training) -> TrialConfig:
    return config.model_copy(update={"training": config.training.model_copy(update=training)})


def with_model(config: TrialConfig, **fields) -> TrialConfig:
    return config.model_copy(update={"model": config.model.model_copy(update=fields)})


def is_inference(name: str) -> bool:
    return name.startswith(INFERENCE_PARAMS)


# -- word dropout -----------------------------------------------------------------------------


def test_word_dropout_off_builds_no_unk_row_and_draws_nothing(batch):
    off = model()
    assert "decoder.unk_embedding" not in dict(off.named_parameters())
    on = model(word_dropout=0.5)
    assert on.decoder.unk_embedding.shape == (off.embedding.embedding_dim,)
    assert torch.equal(on.decoder.unk_embedding, torch.zeros(off.embedding.embedding_dim))
    # The row consumes no draw at initialisation: every other parameter is the same.
    for name, param in off.named_parameters():
        assert torch.equal(param, dict(on.named_parameters())[name]), name
    off.train()
    state = torch.get_rng_state()
    first = off(*batch).token_nll
    assert torch.equal(torch.get_rng_state(), state)  # enumerate, p = 0: no random draw at all
    assert torch.equal(off(*batch).token_nll, first)


def test_nothing_dropped_is_exactly_no_word_dropout(batch):
    off, on = model(), model(word_dropout=0.5)
    context, decoder_input, target, mask = batch
    condition = torch.randn(decoder_input.shape[0], 64 + 5)
    nothing = torch.zeros_like(decoder_input, dtype=torch.bool)
    assert torch.equal(on.decoder.token_nll(decoder_input, target, condition, nothing),
                       off.decoder.token_nll(decoder_input, target, condition))


def test_evaluation_never_drops(batch):
    on, off = model(word_dropout=1.0), model()
    on.eval()
    off.eval()
    state = torch.get_rng_state()
    assert torch.equal(on(*batch).token_nll, off(*batch).token_nll)
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize("family,fields", [
    ("discrete", {}), ("continuous", {}), ("discrete", {"discrete_estimator": "gumbel"}),
])
def test_word_dropout_one_leaves_the_decoder_no_token_information(batch, family, fields):
    context, decoder_input, target, mask = batch
    other = scrambled(decoder_input)
    for rate, invariant in ((1.0, True), (0.0, False)):
        cvae = model(family, word_dropout=rate, **fields)
        cvae.train()
        torch.manual_seed(1)
        mine = cvae(context, decoder_input, target, mask).token_nll
        torch.manual_seed(1)  # the same z draws
        theirs = cvae(context, other, target, mask).token_nll
        assert torch.equal(mine, theirs) is invariant, rate
        assert mine[mask].gt(0).all()


def test_the_realised_drop_rate_is_p(batch):
    generator = torch.Generator().manual_seed(0)
    for rate in (0.0, 0.25, 0.6, 1.0):
        dropped = word_dropout_mask((4000, 26), rate, torch.device("cpu"), generator)
        assert not dropped[:, 0].any()  # BOS stays
        realised = float(dropped[:, 1:].double().mean())
        sigma = math.sqrt(rate * (1 - rate) / dropped[:, 1:].numel())
        assert abs(realised - rate) <= 5 * sigma + 1e-12, (rate, realised)
    # Through the model: the mask the decoder reads.
    cvae = model(word_dropout=0.3)
    cvae.train()
    seen = []
    embed = cvae.decoder.embed
    cvae.decoder.embed = lambda tokens, dropped=None: seen.append(dropped) or embed(tokens, dropped)
    for _ in range(40):
        cvae(*batch)
    rows = batch[1].shape[0]
    drawn = torch.cat([d.view(-1, TASK.num_strategies, d.shape[-1])[:, 0] for d in seen])
    assert drawn.shape[0] == 40 * rows
    # The enumerated categories read one mask per example.
    assert all(torch.equal(d.view(rows, TASK.num_strategies, -1)[:, 0], d.view(rows, TASK.num_strategies, -1)[:, 2])
               for d in seen)
    realised = float(drawn[:, 1:].double().mean())
    assert abs(realised - 0.3) <= 5 * math.sqrt(0.3 * 0.7 / drawn[:, 1:].numel())


def test_functional_forward_matches_the_module_with_word_dropout(batch):
    """Member k of the stacked forward, given the module's own mask, is the module's output."""
    context, decoder_input, target, mask = batch
    for family in ("discrete", "continuous"):
        cvae = model(family, word_dropout=0.4)
        cvae.train()
        torch.manual_seed(3)
        out = cvae(context, decoder_input, target, mask)
        torch.manual_seed(3)
        dropped = word_dropout_mask(decoder_input.shape, 0.4, decoder_input.device)
        noise = torch.randn(decoder_input.shape[0], 5) if family == "continuous" else None
        params = {name: param.detach().unsqueeze(0) for name, param in cvae.named_parameters()}
        stacked = cvae_forward(params, cvae.config, cvae.num_categories, context[None], decoder_input[None],
                               target[None], mask[None], None if noise is None else noise[None],
                               dropped=dropped[None])
        torch.testing.assert_close(stacked["token_nll"][0], out.token_nll, rtol=1e-5, atol=1e-5)
        blind = cvae_forward(params, cvae.config, cvae.num_categories, context[None],
                             scrambled(decoder_input)[None], target[None], mask[None],
                             None if noise is None else noise[None], dropped=torch.ones_like(dropped)[None])
        again = cvae_forward(params, cvae.config, cvae.num_categories, context[None], decoder_input[None],
                             target[None], mask[None], None if noise is None else noise[None],
                             dropped=torch.ones_like(dropped)[None])
        assert torch.equal(blind["token_nll"], again["token_nll"])


# -- the phases' plan and stacks --------------------------------------------------------------


def test_update_plan_puts_encoder_updates_on_the_next_batches():
    aggressive = TrainingConfig(epochs=3, aggressive_epochs=2, aggressive_encoder_steps=2)
    assert phases.update_plan(3, aggressive, 0) == [
        (1, "encoder"), (2, "encoder"), (0, "decoder"),
        (2, "encoder"), (0, "encoder"), (1, "decoder"),
        (0, "encoder"), (1, "encoder"), (2, "decoder"),
    ]
    assert phases.update_plan(3, aggressive, 1)[-1] == (2, "decoder")
    assert phases.update_plan(3, aggressive, 2) == [(0, "all"), (1, "all"), (2, "all")]
    assert phases.update_plan(2, TrainingConfig(), 0) == [(0, "all"), (1, "all")]
    assert [n for n in ("target_encoder.gru.weight_hh_l0", "posterior_head.bias", "prior_head.bias",
                        "decoder.gru.bias_hh_l0", "embedding.weight", "context_encoder.gru.bias_ih_l0")
            if phases.in_part(n, "encoder")] == ["target_encoder.gru.weight_hh_l0", "posterior_head.bias"]
    assert not phases.in_part("posterior_head.bias", "decoder")
    assert phases.in_part("embedding.weight", "decoder") and phases.in_part("embedding.weight", "all")


def test_pretraining_stack_holds_beta_at_zero_then_restarts_its_anneal():
    spec = LossStackSpec(preset="uniform", alpha=0.0, terms={"kl": {"weight": 2.0, "options": {
        "anneal": "linear", "anneal_start": 0.0, "warmup_steps": 4}}})
    stack = spec.build()
    training = TrainingConfig(epochs=3, autoencoder_epochs=2, batch_size=10)
    pretraining = phases.training_stack(stack, training, rows=25)  # 3 steps per epoch
    assert isinstance(pretraining, phases.PretrainingStack) and pretraining.kl_from_step == 6
    assert [pretraining.weights_at(s)["kl"] for s in range(12)] == [0.0] * 6 + [0.0, 0.5, 1.0, 1.5, 2.0, 2.0]
    assert all(pretraining.weights_at(s)["uniform"] == 1.0 for s in range(12))
    assert phases.training_stack(stack, TrainingConfig(), rows=25) is stack
    # A stack built with the train split's mean kappa keeps it (and computes what it computed).
    spec = LossStackSpec(preset="train_kappa_corrected", alpha=1.0, terms={"kl": 0.5})
    built = spec.build(train_kappa={1.0: 1.7})
    wrapped = phases.training_stack(built, training, rows=25)
    assert wrapped.train_kappa == {1.0: 1.7} and wrapped.term_names == built.term_names


def test_phase_budgets_are_checked_naming_the_field():
    with pytest.raises(ValueError, match=r"training.autoencoder_epochs \(3\) must be below training.epochs"):
        TrainingConfig(epochs=3, autoencoder_epochs=3)
    with pytest.raises(ValueError, match=r"training.aggressive_epochs \(4\) is more than training.epochs"):
        TrainingConfig(epochs=3, aggressive_epochs=4)
    TrainingConfig(epochs=3, aggressive_epochs=3, autoencoder_epochs=2)


def test_selection_skips_the_pretraining_epochs():
    selection = Selection(patience=1, min_epochs=1, min_delta=0.0, first_epoch=3)
    net = torch.nn.Linear(1, 1)
    for epoch, loss in ((1, 0.1), (2, 0.2), (3, 5.0)):
        selection.update(epoch, {"val/loss": loss}, net)
    assert (selection.best_epoch, selection.best_loss, selection.stopped) == (3, 5.0, False)
    selection.update(4, {"val/loss": 6.0}, net)
    assert selection.stopped


# -- the lone trainer -------------------------------------------------------------------------


def snapshot(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {name: param.detach().clone() for name, param in trainer.model.named_parameters()}


PLAN = [(0, "encoder"), (1, "encoder"), (0, "decoder"), (2, "all")]


def moved_per_update(params, optimizer, run) -> list[set[str]]:
    """Run ``run()``; the names of the parameters each optimizer step changed, step by step."""
    seen = [{name: value.detach().clone() for name, value in params().items()}]
    step = optimizer.step

    def recording(*args, **kwargs):
        step(*args, **kwargs)
        seen.append({name: value.detach().clone() for name, value in params().items()})

    optimizer.step = recording
    run()
    return [{name for name in after if not torch.equal(after[name], before[name])}
            for before, after in zip(seen, seen[1:], strict=False)]


def test_each_update_moves_only_its_parts_parameters(tmp_path, monkeypatch):
    config = with_model(base_config("continuous", epochs=1), word_dropout=0.2)
    trainer = Trainer.create(config, tmp_path)
    monkeypatch.setattr(phases, "update_plan", lambda batches, training, epoch: PLAN)
    moved = moved_per_update(lambda: dict(trainer.model.named_parameters()), trainer.optimizer,
                             trainer.train_epoch)
    # bow_head.*: no term of this stack reads the bag-of-words logits, so no update moves it.
    names = {name for name, _ in trainer.model.named_parameters() if not name.startswith("bow_head.")}
    inference = {name for name in names if is_inference(name)}
    assert moved == [inference, inference, names - inference, names]
    steps = {name: float(trainer.optimizer.state[p]["step"]) for name, p in trainer.model.named_parameters()
             if p in trainer.optimizer.state}
    assert steps == {name: 3.0 if name in inference else 2.0 for name in names}
    assert trainer.step == 2  # encoder-only updates are not counted


def test_each_cohort_update_moves_only_its_parts_slices(tmp_path, monkeypatch):
    configs = members(base_config("continuous", epochs=1))[:2]
    cohort = Cohort.create(configs, tmp_path)
    monkeypatch.setattr(phases, "update_plan", lambda batches, training, epoch: PLAN)
    moved = moved_per_update(lambda: cohort.params, cohort.optimizer, lambda: cohort.run_epoch())
    names = {name for name in cohort.params if not name.startswith("bow_head.")}  # bow_head: no member's stack reads it
    inference = {name for name in names if is_inference(name)}
    assert moved == [inference, inference, names - inference, names]
    assert cohort.step == 2
    assert all(len(m.step_losses) == 2 for m in cohort.members)


def test_autoencoder_pretraining_trains_without_kl_then_resets_the_decoder(tmp_path):
    config = with_training(base_config("discrete", epochs=2), autoencoder_epochs=1)
    trainer = Trainer.create(config, tmp_path)
    initial = snapshot(trainer)
    assert {n for n, v in phases.initial_decoder(config, trainer.view.vocab_size, trainer.view.num_strategies).items()
            if torch.equal(v, initial[n])} == {n for n in initial if n.startswith("decoder.")}
    trainer.run_epoch()
    after_pretraining = snapshot(trainer)
    # beta = 0: the learned prior, reached only by the KL, has no gradient and no AdamW state.
    assert all(torch.equal(after_pretraining[n], initial[n]) for n in initial if n.startswith("prior_head."))
    assert not any(n.startswith("prior_head.") and p in trainer.optimizer.state
                   for n, p in trainer.model.named_parameters())
    assert trainer.history["train/kl"][0] > 0  # the KL is computed and logged, just not trained on
    state = torch.get_rng_state()
    parts = phases.start_epoch(trainer, 1)
    assert torch.equal(torch.get_rng_state(), state)
    reset = snapshot(trainer)
    for name in initial:
        expected = initial[name] if name.startswith("decoder.") else after_pretraining[name]
        assert torch.equal(reset[name], expected), name
    assert not any(n.startswith("decoder.") and p in trainer.optimizer.state for n, p in trainer.model.named_parameters())
    assert {id(p) for p in parts["encoder"]} | {id(p) for p in parts["decoder"]} == {
        id(p) for p in trainer.model.parameters()}


def test_pretraining_epochs_are_never_selected(tmp_path):
    config = with_training(base_config("discrete", epochs=3), autoencoder_epochs=2)
    trainer = Trainer.create(config, tmp_path)
    trainer.run()
    assert trainer.selection.best_epoch == 3
    assert trainer.final_metrics["selected/epoch"] == 3


# -- cohorts ----------------------------------------------------------------------------------


REMEDIES = {
    "word dropout": ({"word_dropout": 0.3}, {}),
    "aggressive": ({}, {"aggressive_epochs": 1, "aggressive_encoder_steps": 2}),
    "pretraining": ({}, {"autoencoder_epochs": 1}),
}


def remedied(config: TrialConfig, model_fields: dict, training: dict) -> TrialConfig:
    return with_training(with_model(config, **model_fields), **training)


def test_remedies_are_part_of_the_cohort_key():
    config = base_config("discrete")
    variants = [remedied(config, *fields) for fields in REMEDIES.values()]
    variants.append(with_training(config, autoencoder_epochs=1, autoencoder_reset_decoder=False))
    variants.append(with_training(config, aggressive_epochs=1, aggressive_encoder_steps=3))
    assert len({cohort_key(c) for c in [config, *variants]}) == len(variants) + 1
    assert group_cohorts([config, *variants, config], 4) == [[0, 6], [1], [2], [3], [4], [5]]


@pytest.mark.parametrize("family,model_fields,training", [
    ("continuous", {"word_dropout": 0.3}, {"aggressive_epochs": 1, "aggressive_encoder_steps": 2}),
    ("discrete", {"word_dropout": 0.5, "discrete_estimator": "gumbel"}, {"autoencoder_epochs": 1}),
    ("discrete", {"target_encoder": "bidirectional"},
     {"autoencoder_epochs": 1, "aggressive_epochs": 2, "aggressive_encoder_steps": 1}),
])
def test_remedied_members_match_lone_trials_in_float64(family, model_fields, training, float64, tmp_path):
    configs = [remedied(c, model_fields, training) for c in members(base_config(family, epochs=3))]
    result = Cohort.create(configs, tmp_path).run()
    for member, config in zip(result, configs, strict=True):
        assert member.status == "finished", member.error
        lone = Trainer.create(config, tmp_path)
        lone.run()
        assert len(member.step_losses) == 3 * math.ceil(80 / 24)  # counted steps only
        for key, values in lone.history.items():
            if key.startswith("perf/"):
                continue
            tolerance = {"abs": 1e-9} if key.endswith("/loss") else {"abs": 1e-9, "rel": 1e-6}
            assert member.trainer.history[key] == pytest.approx(values, nan_ok=True, **tolerance), key
        for (name, mine), theirs in zip(member.trainer.model.named_parameters(), lone.model.parameters(),
                                        strict=True):
            assert torch.allclose(mine, theirs, atol=1e-9, rtol=0), name
        assert member.trainer.selection.best_epoch == lone.selection.best_epoch
    if model_fields.get("target_encoder"):  # the backward GRU is the inference network's too
        assert any(n.startswith("target_encoder.reverse_gru.") and phases.in_part(n, "encoder")
                   for n, _ in result[0].trainer.model.named_parameters())
    if model_fields.get("word_dropout"):  # the UNK row learns
        assert all(m.trainer.model.decoder.unk_embedding.abs().sum() > 0 for m in result)


def test_a_remedied_trial_resumed_at_the_kl_equals_an_uninterrupted_one(tmp_path):
    config = remedied(base_config("continuous", epochs=3), {"word_dropout": 0.3},
                      {"autoencoder_epochs": 1, "aggressive_epochs": 2, "aggressive_encoder_steps": 2})
    whole = Trainer.create(config, tmp_path)
    whole.run()
    first = Trainer.create(config, tmp_path)
    first.run_epoch()  # the pre-training epoch; the decoder reset is still to come
    path = first.save_checkpoint(tmp_path / "after_pretraining.pt")
    resumed = Trainer.create(config, tmp_path)
    resumed.load_checkpoint(path)
    resumed.run()
    assert resumed.history["val/loss"] == whole.history["val/loss"]
    for (name, mine), theirs in zip(resumed.model.named_parameters(), whole.model.parameters(), strict=True):
        assert torch.equal(mine, theirs), name
