"""POST /sweeps on a real ``ksweep serve`` refuses a causal_lm base it could not run (422, by
field) and queues one it can; the model store is the service's KSWEEP_MODEL_ROOT."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.service.conftest import ServiceProcess, auth
from tests.support.tiny_lm import build_tiny_llama, text_table
from workers.datasets.store import DatasetStore
from workers.datasets.table import canonicalize, tokenizer_of
from workers.lm.loading import fingerprint_files
from workers.lm.registry import ModelStore
from workers.lm.tokenizer import ModelTextTokenizer

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "dataset" / "spec.yaml"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def service(tmp_path_factory) -> Iterator[ServiceProcess]:
    workdir = tmp_path_factory.mktemp("lm-submit")
    models = ModelStore(workdir / "admin-models")
    record = models.add(build_tiny_llama(workdir / "tiny"), name="tiny", fingerprint=fingerprint_files)
    datasets = DatasetStore(workdir / "root" / "datasets")  # the service's default data root
    good = canonicalize(text_table(40), "t.parquet", tokenizer=ModelTextTokenizer.of(models, record))
    datasets.add(good, name="words", owner="alice", tokenizer=tokenizer_of(good))
    other = canonicalize(text_table(40), "t.parquet")
    datasets.add(other, name="bytes", owner="alice", tokenizer=tokenizer_of(other))
    svc = ServiceProcess(workdir, KSWEEP_MODEL_ROOT=str(workdir / "admin-models"),
                         KSWEEP_MAX_CONCURRENT_SWEEPS="0")
    svc.start()
    yield svc
    svc.stop()


def spec(dataset: str, **base) -> dict:
    body = yaml.safe_load(EXAMPLE.read_text())
    body["template"]["data"] = {"dataset": dataset}
    body["template"]["base"] = {"kind": "causal_lm", **base}
    return body


def submit(service: ServiceProcess, body: dict) -> httpx.Response:
    with service.client() as client:
        return client.post("/sweeps", json=body, headers=auth("alice"))


def test_submission_checks_model_pin_and_tokenizer(service: ServiceProcess) -> None:
    answer = submit(service, spec("bytes", model="tiny"))
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"]
    assert detail.startswith("template.base.model: dataset 'bytes' was tokenized by tokenizer "
                             "'bytes', but model 'tiny' uses tokenizer")
    answer = submit(service, spec("words", model="nope"))
    assert answer.status_code == 422 and "template.base.model: model 'nope' is not registered" \
        in answer.json()["detail"]
    answer = submit(service, spec("words", model="tiny", model_sha256="c" * 64))
    assert answer.status_code == 422
    assert answer.json()["detail"].startswith("template.base.model_sha256: pinned cccc")
    answer = submit(service, spec("words", model="tiny"))
    assert answer.status_code == 201, answer.text
