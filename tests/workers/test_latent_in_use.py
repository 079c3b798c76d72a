"""Known answers for a latent in use: a label written in y_1 is found, and the two failures
the remedy replaces (every example on one category; an encoder that forgot y_1)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.support.datasets import label_in_first_token_table, register
from workers.data.config import DatasetDataConfig
from workers.datasets.resolve import resolve_dataset
from workers.train import Trainer, TrialConfig

CLASSES, LENGTH = 4, 12
ELBO_BETA_1 = 1 / LENGTH  # beta 1 in ELBO units: the KL is per sequence, the reconstruction per token


@pytest.fixture(scope="module")
def label_first(tmp_path_factory) -> tuple[Path, DatasetDataConfig]:
    root = tmp_path_factory.mktemp("label_first")
    table = label_in_first_token_table(rows=960, classes=CLASSES, length=LENGTH)
    register(root / "datasets", table, "label_first")
    return root, resolve_dataset(DatasetDataConfig(dataset="label_first"), root / "datasets")


def _train(root: Path, data: DatasetDataConfig, *, prior: str, credit: float, beta: float,
           target_encoder: str) -> dict[str, float]:
    config = TrialConfig.model_validate({
        "seed": 1, "data": data.model_dump(), "base": {"kind": "precomputed"},
        "model": {"embedding_dim": 16, "hidden_dim": 32, "prior": prior, "target_encoder": target_encoder},
        "loss_stack": {"preset": "uniform", "terms": {"kl": {
            "weight": beta, "options": {"mutual_info_credit": credit}}}},
        "training": {"epochs": 8, "batch_size": 32, "learning_rate": 3e-3},
        "readouts": {"gradient_batch": 0}})
    trainer = Trainer.create(config, root)
    trainer.run()
    return trainer.final_metrics


@pytest.mark.slow
def test_batch_prior_regularisation_and_a_bidirectional_posterior_find_the_label(label_first):
    final = _train(*label_first, prior="standard", credit=1.0, beta=ELBO_BETA_1,
                   target_encoder="bidirectional")
    assert 0.5 < final["selected/test/mutual_info"] <= math.log(CLASSES) + 1e-6  # of log 4 nats
    assert final["selected/test/latent_ami"] > 0.95
    assert final["selected/test/latent_ami_within_length"] > 0.95  # not through length
    assert final["selected/test/active_units"] >= 2  # categories whose probability follows the label


@pytest.mark.slow
def test_a_learned_prior_without_context_lets_every_example_land_in_one_category(label_first):
    """p(z | x) is a constant when x is empty: it follows the aggregate posterior, so the KL
    never penalises a posterior that puts every example on one category, at any beta."""
    final = _train(*label_first, prior="learned", credit=0.0, beta=1e-3, target_encoder="bidirectional")
    assert final["selected/test/mutual_info"] < 0.05
    assert final["selected/test/kl"] < 0.05
    assert abs(final["selected/test/latent_ami"]) < 0.05
    assert final["selected/test/active_units"] == 0 and final["selected/test/used_categories"] <= 2


@pytest.mark.slow
def test_a_forward_posterior_has_forgotten_y1_after_eleven_tokens(label_first):
    """The same remedy with the posterior reading y through a forward GRU's last state only:
    eleven identical tokens later the state no longer depends on y_1, so z cannot carry it."""
    final = _train(*label_first, prior="standard", credit=1.0, beta=ELBO_BETA_1, target_encoder="forward")
    assert final["selected/test/mutual_info"] < 0.05
    assert abs(final["selected/test/latent_ami"]) < 0.05
