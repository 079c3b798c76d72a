"""scripts/calibrate_caveat.py: the replayed early-stopping rule and the break-even beta."""

from __future__ import annotations

import math

import pytest
import torch

from tests.support.scripts import SCRIPTS, load_script

calibrate = load_script("calibrate_caveat.py")


def test_replay_stops_where_the_trainer_would():
    # best at epoch 3; four epochs without improvement after it -> stop at 7
    assert calibrate.replay([3.0, 2.0, 1.0, 2.0, 2.0, 2.0, 2.0, 0.5], 4, 1) == (7, 3)
    # min_epochs holds the stop back; a later improvement is then selected
    assert calibrate.replay([3.0, 2.0, 1.0, 2.0, 2.0, 2.0, 2.0, 0.5, 1.0], 4, 8) == (9, 8)
    assert calibrate.replay([3.0, 2.0, 1.0], None, 1) == (3, 3)


def test_set_writes_dotted_keys():
    tree = {"template": {"model": {"hidden_dim": 64}}}
    calibrate._set(tree, "template.model.dropout", 0.3)
    calibrate._set(tree, "common_terms.kl.weight", 0.05)
    assert tree == {"template": {"model": {"hidden_dim": 64, "dropout": 0.3}},
                    "common_terms": {"kl": {"weight": 0.05}}}


@pytest.mark.parametrize("alpha", [1.0, 2.0])
def test_break_even_of_a_hand_computed_row(alpha):
    # one example: b = [log 4, 0.5], h = [0, 0.5]: only the first token is explained (log 4)
    from objectives import token_weight_stats

    b = torch.tensor([[math.log(4), 0.5]], dtype=torch.float64)
    h = torch.tensor([[0.0, 0.5]], dtype=torch.float64)
    mask = torch.ones_like(b, dtype=torch.bool)
    stats = token_weight_stats(b, mask, alpha)
    pi0 = math.log(4) ** alpha / (math.log(4) ** alpha + 0.5 ** alpha)
    gain = float((stats.weights * (b - h)).sum()) / math.log(4)
    assert gain == pytest.approx(pi0)


def test_cohort_records_each_member_as_its_lone_trial(tmp_path, monkeypatch):
    """Two points trained as one cohort: one record each, with the lone trial's val loss."""
    import argparse
    import json

    from workers.train.loop import Trainer

    record = tmp_path / "cohorts.jsonl"
    monkeypatch.setattr(calibrate, "COHORT_RECORD", record)
    monkeypatch.chdir(tmp_path)
    spec_path = str(SCRIPTS.parent / "sweeps" / "examples" / "note_caveat.yaml")
    tiny = ["template.data.train_size=64", "template.data.val_size=32",
            "template.data.test_size=32", "template.readouts.gradient_batch=0"]
    members = ["raw_token_weighted:1:0.3:0:0:continuous", "concentration_corrected:2:0.1:1::continuous"]
    calibrate.cohort(argparse.Namespace(spec=spec_path, label="t", epochs=1, member=members,
                                        set=tiny))
    rows = [json.loads(line) for line in record.read_text().splitlines()]
    assert [r["member"] for r in rows] == members and all(r["epochs"] == 1 for r in rows)
    assert all(r["status"] == "finished" for r in rows)
    spec = calibrate._spec_with(spec_path, [*tiny, "template.training.epochs=1"])
    lone = Trainer.create(spec.trial_config(2.0, "concentration_corrected", "continuous", 1,
                                            beta=0.1), cache_root=str(tmp_path))
    assert rows[1]["curves"]["val/loss"][0] == pytest.approx(lone.run_epoch()["val/loss"], rel=1e-4)
