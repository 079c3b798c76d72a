"""The causal_lm base on a tiny Llama built from a config here (no download): the model store,
b_t against an unbatched per-example computation, padding, BOS, refusals, the cache, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.support.tiny_lm import VOCAB, build_tiny_llama
from workers.lm.loading import (
    bos_token_id,
    fingerprint_files,
    load_model,
    load_tokenizer,
    offline_transformers,
    tokenizer_fingerprint,
)
from workers.lm.registry import (
    ModelConflict,
    ModelError,
    ModelNotFound,
    ModelStore,
    check_dataset_tokenizer,
)
from workers.lm.surprisal import c_base_of_rows, cached_lm_base_nll, token_surprisal

transformers = offline_transformers()
torch = pytest.importorskip("torch")

@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def model(tiny: Path):
    return load_model(tiny)


def reference_nll(model, x: list[int], y: list[int], bos: int) -> np.ndarray:
    """One example alone, no padding, no mask, float64 log-softmax: the independent answer."""
    prefix = x if x else [bos]
    ids = torch.tensor([prefix + y[:-1]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].double()
    log_probs = logits.log_softmax(-1)[len(prefix) - 1:]
    return -log_probs[torch.arange(len(y)), torch.tensor(y)].numpy()


def examples(seed: int, n: int) -> tuple[list[list[int]], list[list[int]]]:
    rng = np.random.default_rng(seed)
    xs = [rng.integers(4, VOCAB, rng.integers(0, 9)).tolist() for _ in range(n)]
    ys = [rng.integers(4, VOCAB, rng.integers(1, 12)).tolist() for _ in range(n)]
    return xs, ys


def test_batched_surprisal_equals_unbatched_reference(model) -> None:
    xs, ys = examples(0, 23)
    got = token_surprisal(model, xs, ys, bos_id=1, max_batch_tokens=64, progress=False)
    assert [len(g) for g in got] == [len(y) for y in ys]
    for x, y, g in zip(xs, ys, got, strict=True):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, reference_nll(model, x, y, 1), rtol=1e-5, atol=1e-6)
    assert min(float(g.min()) for g in got) >= 0


def test_padding_is_masked_batch_composition_changes_nothing(model) -> None:
    xs, ys = examples(1, 9)
    alone = token_surprisal(model, xs, ys, bos_id=1, max_batch_tokens=1, progress=False)
    # One batch where most rows are padded far beyond their length by a 60-token row.
    xs2, ys2 = [*xs, list(range(4, 44))], [*ys, list(range(4, 24))]
    together = token_surprisal(model, xs2, ys2, bos_id=1, max_batch_tokens=10_000, progress=False)
    for a, b in zip(alone, together, strict=False):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_empty_x_conditions_the_first_token_on_bos(model, tiny: Path) -> None:
    tokenizer = load_tokenizer(tiny)
    bos = bos_token_id(model, tokenizer)
    assert bos == 1 == tokenizer.bos_token_id
    # The tokenizer adds no BOS of its own: ids are the dataset's, prefixes are ours.
    assert tokenizer("w0 w1", add_special_tokens=False).input_ids == [4, 5]
    y = [7, 9, 11]
    with_bos = token_surprisal(model, [[]], [y], bos_id=bos, progress=False)[0]
    np.testing.assert_allclose(with_bos, reference_nll(model, [1], y, 1), rtol=1e-5)
    explicit = token_surprisal(model, [[1]], [y], bos_id=2, progress=False)[0]
    np.testing.assert_allclose(with_bos, explicit, rtol=1e-6)
    other = token_surprisal(model, [[]], [y], bos_id=2, progress=False)[0]
    assert abs(float(other[0] - with_bos[0])) > 1e-4  # the first token really saw the BOS


def test_bos_falls_back_to_eos_when_the_tokenizer_has_none(tmp_path: Path) -> None:
    folder = build_tiny_llama(tmp_path / "nobos", bos=False)
    tokenizer = load_tokenizer(folder)
    assert tokenizer.bos_token_id is None
    assert bos_token_id(load_model(folder), tokenizer) == 2


def test_bad_ids_and_empty_y_are_refused_naming_the_row(model) -> None:
    with pytest.raises(ModelError, match=r"row 1: token id 48 is outside .*\[0, 48\)"):
        token_surprisal(model, [[], [4]], [[5], [48]], bos_id=1, progress=False)
    with pytest.raises(ModelError, match="row 0: y is empty"):
        token_surprisal(model, [[4]], [[]], bos_id=1, progress=False)


def test_store_hashes_copies_and_names(tiny: Path, tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "models")
    record = store.add(tiny, name="tiny", fingerprint=fingerprint_files)
    assert record.format == "hf" and record.vocab_size == VOCAB
    assert set(record.files) >= {"config.json", "model.safetensors", "tokenizer.json"}
    assert record.tokenizer_sha256 == tokenizer_fingerprint(load_tokenizer(tiny))
    copied = store.model_path(record)
    assert (copied / "model.safetensors").read_bytes() == (tiny / "model.safetensors").read_bytes()
    assert store.add(tiny, name="tiny") == record  # same name, same content: a no-op
    assert [r.name for r in store.list()] == ["tiny"]
    store.verify(record)
    # Another config is other content: another hash, and the name is not silently repointed.
    other = tmp_path / "other"
    build_tiny_llama(other, seed=1)
    with pytest.raises(ModelConflict, match="'tiny' is taken"):
        store.add(other, name="tiny")
    assert store.add(other, name="tiny2").sha256 != record.sha256
    with pytest.raises(ModelNotFound, match="'nope' is not registered.*tiny, tiny2"):
        store.get("nope")
    with pytest.raises(ModelError, match="never a path"):
        store.add(tiny, name="../x")
    (copied / "config.json").write_text("{}")
    with pytest.raises(ModelError, match=r"config\.json: missing or changed"):
        store.verify(record)
    # The registered copy loads offline and computes what the source folder computes.
    store2 = ModelStore(tmp_path / "models2")
    rec2 = store2.add(tiny, name="tiny")
    reloaded = load_model(store2.model_path(rec2))
    y = [[5, 6, 7]]
    np.testing.assert_allclose(
        token_surprisal(reloaded, [[]], y, bos_id=1, progress=False)[0],
        token_surprisal(load_model(tiny), [[]], y, bos_id=1, progress=False)[0], rtol=1e-6)


@pytest.mark.parametrize("weight", ["pytorch_model.bin", "model.pt", "weights.pth", "x.pkl"])
def test_pickle_weights_are_refused_naming_the_file(tiny: Path, tmp_path: Path, weight: str) -> None:
    folder = tmp_path / "pickled"
    folder.mkdir()
    for f in tiny.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    (folder / weight).write_bytes(b"\x80\x04K\x01.")
    store = ModelStore(tmp_path / "models")
    with pytest.raises(ModelError, match=rf"{weight}: pickle-based weights are refused"):
        store.add(folder, name="pickled")
    with pytest.raises(ModelError, match=rf"{weight}: pickle-based weights are refused"):
        store.add(folder / weight, name="pickled")
    assert store.list() == [] and not (tmp_path / "models" / "objects").exists()


def test_folder_without_safetensors_or_config_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match=r"config\.json: missing"):
        ModelStore(tmp_path / "m").add(tmp_path / "empty", name="x")
    (tmp_path / "empty" / "config.json").write_text("{}")
    with pytest.raises(ModelError, match=r"no \*\.safetensors weights"):
        ModelStore(tmp_path / "m").add(tmp_path / "empty", name="x")


def test_tokenizer_mismatch_is_refused_naming_both(tiny: Path, tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "models")
    record = store.add(tiny, name="tiny", fingerprint=fingerprint_files)
    check_dataset_tokenizer("ok", f"tiny@{record.tokenizer_sha256}", record)  # passes
    # A tokenizer that maps the same ids to other words is another tokenizer.
    other = build_tiny_llama(tmp_path / "other")
    vocab = json.loads((other / "tokenizer.json").read_text())
    vocab["model"]["vocab"] = {k if v < 4 else f"v{v}": v for k, v in vocab["model"]["vocab"].items()}
    (other / "tokenizer.json").write_text(json.dumps(vocab))
    other_sha = tokenizer_fingerprint(load_tokenizer(other))
    assert other_sha != record.tokenizer_sha256
    with pytest.raises(ModelError) as caught:
        check_dataset_tokenizer("fortunes", other_sha, record)
    message = str(caught.value)
    assert "'fortunes'" in message and other_sha in message
    assert "'tiny'" in message and record.tokenizer_sha256 in message
    with pytest.raises(ModelError, match="'ids' records no tokenizer"):
        check_dataset_tokenizer("ids", None, record)


def test_cache_computes_once_per_dataset_and_model(tiny: Path, tmp_path: Path, model) -> None:
    store = ModelStore(tmp_path / "models")
    record = store.add(tiny, name="tiny", fingerprint=fingerprint_files)
    xs, ys = examples(2, 12)
    first = cached_lm_base_nll(xs, ys, dataset_sha256="a" * 64, store=store, record=record,
                               cache_root=tmp_path / "cache", train_rows=range(6), progress=False)
    assert not first.cache_hit and first.tokens == sum(map(len, ys))
    for x, y, got in zip(xs, ys, first.rows, strict=True):
        np.testing.assert_allclose(got, reference_nll(model, x, y, 1), rtol=1e-5, atol=1e-6)
    expected_c = np.mean([reference_nll(model, x, y, 1).mean() for x, y in zip(xs[:6], ys[:6], strict=True)])
    assert first.c_base == pytest.approx(expected_c, rel=1e-5)
    again = cached_lm_base_nll(xs, ys, dataset_sha256="a" * 64, store=store, record=record,
                               cache_root=tmp_path / "cache", progress=False)
    assert again.cache_hit and again.cache_path == first.cache_path
    assert again.c_base == pytest.approx(c_base_of_rows(first.rows), rel=1e-9)
    for a, b in zip(first.rows, again.rows, strict=True):
        np.testing.assert_array_equal(a, b)
    meta = json.loads((first.cache_path / "meta.json").read_text())
    assert meta["model_sha256"] == record.sha256 and meta["bos_id"] == 1


def test_cli_model_add_and_list(tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from ksweep.cli import app

    monkeypatch.setenv("KSWEEP_SWEEP_ROOT", str(tmp_path / "root"))
    runner = CliRunner()
    result = runner.invoke(app, ["model", "add", str(tiny), "--name", "tiny"])
    assert result.exit_code == 0, result.output
    assert "registered model tiny" in result.output
    assert (tmp_path / "root" / "models" / "names" / "tiny.json").exists()
    listed = runner.invoke(app, ["model", "list", "--json"])
    assert json.loads(listed.output)[0]["vocab_size"] == VOCAB
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"x")
    refused = runner.invoke(app, ["model", "add", str(bad), "--name", "bad"])
    assert refused.exit_code == 2
    assert "bad.pt: pickle-based weights are refused" in " ".join(refused.output.split())
    monkeypatch.setenv("KSWEEP_MODEL_ROOT", str(tmp_path / "admin-models"))
    assert runner.invoke(app, ["model", "add", str(tiny), "--name", "t"]).exit_code == 0
    assert (tmp_path / "admin-models" / "names" / "t.json").exists()


def test_dataset_registered_with_the_model_tokenizer_passes_and_bytes_is_refused(
        tiny: Path, tmp_path: Path) -> None:
    import pyarrow as pa

    from workers.datasets.store import DatasetStore
    from workers.datasets.table import canonicalize, tokenizer_of
    from workers.lm.tokenizer import ModelTextTokenizer

    models = ModelStore(tmp_path / "models")
    record = models.add(tiny, name="tiny", fingerprint=fingerprint_files)
    text = pa.table({"x_text": ["", "w3 w4"], "y_text": ["w1 w2 w9", "w5"]})
    tok = ModelTextTokenizer.of(models, record)
    table = canonicalize(text, "t.parquet", tokenizer=tok)
    assert table.column("y").to_pylist() == [[5, 6, 13], [9]]  # no special token added
    assert table.column("x").to_pylist() == [[], [7, 8]]
    datasets = DatasetStore(tmp_path / "datasets")
    good = datasets.add(table, name="good", owner="t", tokenizer=tokenizer_of(table))
    assert good.tokenizer == f"tiny@{record.tokenizer_sha256}"
    check_dataset_tokenizer(good.name, good.tokenizer, record)
    as_bytes = canonicalize(text, "t.parquet")  # the store's default byte tokenizer
    bad = datasets.add(as_bytes, name="bad", owner="t", tokenizer=tokenizer_of(as_bytes))
    with pytest.raises(ModelError, match=r"'bad' was tokenized by tokenizer 'bytes', but model "
                                         r"'tiny' uses tokenizer [0-9a-f]{64}"):
        check_dataset_tokenizer(bad.name, bad.tokenizer, record)


def test_transformers_is_offline() -> None:
    import os

    import huggingface_hub.constants

    offline_transformers()
    assert os.environ["HF_HUB_OFFLINE"] == "1" and os.environ["TRANSFORMERS_OFFLINE"] == "1"
    assert huggingface_hub.constants.HF_HUB_OFFLINE is True
