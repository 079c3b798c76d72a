"""The compiled cohort step (workers/cohort/compiled.py): the eager cohort's numbers, no recompiles.

The default run compiles with the ``aot_eager`` backend (dynamo's capture and AOTAutograd's
backward, no C++ build: seconds). The inductor test builds C++ kernels (about 3 minutes on
the shared 2-core machine), so it runs only with ``KSWEEP_INDUCTOR_TESTS=1``.
"""

import logging
import math
import os

import pytest
import torch

from tests.support.groups import compile_tests
from tests.workers.test_cohort import base_config, members, variant
from workers.cohort import compiled as compiled_module
from workers.cohort.compiled import CompiledStep, compile_problem, length_buckets, wants_compile
from workers.cohort.trainer import Cohort
from workers.contract import PERF_COMPILE_SECONDS

pytestmark = compile_tests


def with_compile(configs, mode: str, **training):
    return [c.model_copy(update={"training": c.training.model_copy(update={"compile": mode, **training})})
            for c in configs]


def compiled_cohort(configs, root, backend: str = "aot_eager") -> Cohort:
    cohort = Cohort.create(with_compile(configs, "off"), root)
    cohort._compiled = CompiledStep.create(cohort, "on", root, backend=backend)
    assert cohort._compiled is not None
    return cohort


def assert_same_training(eager, compiled, rtol: float) -> None:
    """Every step's loss, every epoch's metrics and the final parameters agree within ``rtol``."""
    for a, b in zip(eager, compiled, strict=True):
        assert a.status == b.status == "finished", (a.error, b.error)
        assert len(a.step_losses) == len(b.step_losses) > 0
        assert b.step_losses == pytest.approx(a.step_losses, rel=rtol, abs=1e-7)
        for key, values in a.trainer.history.items():
            if key.startswith("perf/"):
                continue
            # Losses as tight as the steps; other read-outs amplify rounding (gradient ratios), and
            # a rank correlation jumps when rounding swaps near-equal values (the gumbel case's
            # near-tied KLs: 1.7e-3 on an AMD EPYC host, whose kernels round differently).
            tolerance = ({"abs": 1e-2} if "spearman" in key else {"rel": rtol, "abs": 1e-6}
                         if key.endswith("/loss") else {"rel": 10 * rtol, "abs": 1e-5})
            assert b.trainer.history[key] == pytest.approx(values, nan_ok=True, **tolerance), key
        # AdamW divides by sqrt(v): where a gradient is about 0, rounding decides a weight's step,
        # so single weights may differ by up to a learning rate; each tensor as a whole agrees.
        for (name, mine), theirs in zip(b.trainer.model.named_parameters(), a.trainer.model.parameters(),
                                        strict=True):
            relative = float(torch.linalg.vector_norm(mine - theirs) / torch.linalg.vector_norm(theirs))
            assert relative <= 10 * rtol, (name, relative)
    assert compiled[0].trainer.history[PERF_COMPILE_SECONDS][0] > 0


def cases():
    """Two of the four member kinds per case (the compiled graph holds one loss per member, so its
    compile time grows with them), each kind in two cases: 0 raw+ncc with a KL, 1 uniform without,
    2 ncc with a per-token KL and bag of words, 3 an annealed KL (in discrete, on its own data)."""
    discrete = members(base_config("discrete"))
    discrete[3] = discrete[3].model_copy(update={"data": discrete[3].data.model_copy(update={"seed": 7})})
    gumbel = members(base_config("discrete", discrete_estimator="gumbel", num_layers=2,
                                 gumbel_anneal_fraction=0.5))
    credit = {"kl": {"weight": 0.5, "options": {"free_bits": 0.3, "mutual_info_credit": 0.5}}}
    gumbel[0] = variant(gumbel[0], 0, {"preset": "raw_plus_ncc", "alpha": 1.0, "terms": credit}, 3e-3)
    remedies = {"autoencoder_epochs": 1, "aggressive_epochs": 2, "aggressive_encoder_steps": 2}
    continuous = members(base_config("continuous"))
    remedied = with_compile(members(base_config("continuous", epochs=3, word_dropout=0.3)), "off", **remedies)
    return {"discrete": [discrete[0], discrete[3]], "continuous": continuous[1:3], "gumbel": [gumbel[0], gumbel[2]],
            "remedies": [remedied[1], remedied[3]]}


@pytest.mark.parametrize("case", ["discrete", "continuous", "gumbel", "remedies"])
def test_compiled_step_matches_the_eager_cohort_at_every_step(case, tmp_path):
    configs = cases()[case]  # 80 train rows in batches of 24: the last batch is padded to 24
    eager = Cohort.create(with_compile(configs, "off"), tmp_path).run()
    compiled = compiled_cohort(configs, tmp_path).run()
    assert_same_training(eager, compiled, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("KSWEEP_INDUCTOR_TESTS") != "1",
                    reason="inductor builds C++ kernels (~3 min on 2 cores); set KSWEEP_INDUCTOR_TESTS=1")
def test_inductor_step_matches_the_eager_cohort_in_float32(tmp_path):
    configs = cases()["discrete"]
    eager = Cohort.create(with_compile(configs, "off"), tmp_path).run()
    cohort = compiled_cohort(configs, tmp_path, backend="inductor")
    compiled = cohort.run()
    assert cohort._compiled.fallback is None
    assert_same_training(eager, compiled, rtol=1e-5)


def test_no_recompile_after_warm_up_across_buckets_a_stop_and_a_failure(tmp_path):
    # Imported here: torch._dynamo would cost every xdist worker's collection about 1 s.
    from torch._dynamo.utils import counters

    # 48 train rows one at a time: 48 steps an epoch, enough to reach both buckets in the warm-up.
    configs = [c.model_copy(update={"data": c.data.model_copy(update={"train_size": 48})})
               for c in with_compile(members(base_config("discrete", epochs=3))[:3], "off", batch_size=1)]
    configs[2] = configs[2].model_copy(update={  # fails in epoch 2
        "training": configs[2].training.model_copy(update={"inject_nan_at_step": 72})})
    cohort = compiled_cohort(configs, tmp_path)
    counters.clear()
    cohort.run_epoch()  # warm-up (48 steps): both length buckets these rows reach (6 and 8 of [2, 4, 6, 8])
    step = cohort._compiled
    assert step._buckets == [2, 4, 6, 8] and step._warm == {6, 8}
    warm_graphs = counters["stats"]["unique_graphs"]
    assert warm_graphs == 1 + len(step._warm)  # the update, and the loss once per bucket
    with torch.compiler.set_stance("fail_on_recompile"):
        result = cohort.run(on_epoch=lambda member, epoch, _: member.position == 0 and epoch == 2)
    assert step.fallback is None  # a recompile would have raised, and gone eager with the reason
    assert counters["stats"]["unique_graphs"] == warm_graphs
    assert [m.status for m in result] == ["stopped", "finished", "failed"]
    assert "TrialDiverged: loss became nan at step 72 (epoch 2)" in result[2].error
    assert cohort.params["embedding.weight"].shape[0] == 3  # the member axis never changed
    assert len(result[1].trainer.history["val/loss"]) == 3 and len(result[0].trainer.history["val/loss"]) == 2
    # The finished member trained as it would have in the eager cohort (which re-stacks).
    eager = Cohort.create(configs, tmp_path).run(on_epoch=lambda member, epoch, _: member.position == 0 and epoch == 2)
    assert result[1].step_losses == pytest.approx(eager[1].step_losses, rel=1e-5, abs=1e-7)
    assert all(math.isfinite(v) for v in result[1].step_losses)


def test_a_backend_that_fails_falls_back_to_eager_with_the_reason(tmp_path, caplog):
    def broken(graph, example_inputs):
        raise RuntimeError("simulated: this platform cannot compile")

    configs = members(base_config("continuous", epochs=1))[:2]
    eager = Cohort.create(with_compile(configs, "off"), tmp_path).run()
    cohort = compiled_cohort(configs, tmp_path, backend=broken)
    with caplog.at_level(logging.WARNING, logger="workers.cohort.compiled"):
        result = cohort.run()
    assert "simulated: this platform cannot compile" in cohort.compile_fallback
    assert cohort.compile_fallback.endswith("training eagerly")
    assert any("simulated" in record.getMessage() for record in caplog.records)
    for a, b in zip(eager, result, strict=True):
        assert b.status == "finished" and b.step_losses == pytest.approx(a.step_losses, rel=1e-5, abs=1e-7)


def test_no_compiler_means_eager_with_a_logged_reason(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(compiled_module.shutil, "which", lambda name: None)
    assert "needs a C++ compiler" in compile_problem(torch.device("cpu"), "inductor")
    with caplog.at_level(logging.WARNING, logger="workers.cohort.compiled"):
        cohort = Cohort.create(with_compile(members(base_config("discrete", epochs=1))[:1], "on"), tmp_path)
    assert cohort._compiled is None and "needs a C++ compiler" in cohort.compile_fallback
    assert "training eagerly" in caplog.text
    assert cohort.run()[0].status == "finished"


def test_compile_setting_and_buckets(tmp_path, monkeypatch):
    cpu = torch.device("cpu")
    assert not wants_compile("auto", cpu) and not wants_compile("off", cpu) and wants_compile("on", cpu)
    monkeypatch.setattr(compiled_module, "MEASURED_FASTER", frozenset({"cpu"}))
    assert wants_compile("auto", cpu)
    with pytest.raises(ValueError, match="training.compile must be 'auto', 'on' or 'off'"):
        wants_compile("always", cpu)
    assert length_buckets(8) == [2, 4, 6, 8] and length_buckets(11) == [3, 6, 9, 11] and length_buckets(1) == [1]
    monkeypatch.setenv("KSWEEP_SWEEP_ROOT", str(tmp_path / "root"))
    assert compiled_module.inductor_cache_dir(tmp_path) == tmp_path / "root" / "inductor"
    monkeypatch.delenv("KSWEEP_SWEEP_ROOT")
    assert compiled_module.inductor_cache_dir(tmp_path / "cache") == tmp_path / "cache" / "inductor"
    # Inductor's own default (which it writes into the variable) gives way; a chosen directory stays.
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    assert compiled_module.use_inductor_cache(tmp_path / "cache") == str(tmp_path / "cache" / "inductor")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert compiled_module.use_inductor_cache(tmp_path / "cache") == str(tmp_path / "mine")
