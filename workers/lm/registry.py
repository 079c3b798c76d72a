"""The model store: registered causal language models, content-addressed, torch-free.

A model is a Hugging Face folder (``config.json`` + ``*.safetensors`` + tokenizer files) or one
``.gguf`` file; registration copies and hashes its files into an
:class:`~workers.object_store.ObjectStore` (``objects/<sha256>/files/``, the record in
``meta.json`` and ``names/<name>.json``), and a spec names the model, never a path. Pickle-based
weights (``.bin``, ``.pt``, ``.pkl``, ...) are refused: loading them can run code. Python files
are never copied, and every load passes ``trust_remote_code=False``.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from workers.contract import SHA256_HEX_PATTERN
from workers.object_store import META_FILE, ObjectStore, atomic_write

PICKLE_SUFFIXES = frozenset({".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib"})
# Files of a Hugging Face folder that are copied; anything else (README, .py, images) is not.
HF_CONFIG_FILES = frozenset({
    "config.json", "generation_config.json", "model.safetensors.index.json",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
    "merges.txt", "tokenizer.model", "added_tokens.json", "chat_template.jinja",
})
_CHUNK = 1 << 20
_HEX64 = re.compile(SHA256_HEX_PATTERN)


class ModelError(ValueError):
    """A model that cannot be registered or used; the message names the file and the fix."""


class ModelNotFound(ModelError, KeyError):
    """No model is registered under that name."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class ModelConflict(ModelError):
    """The name is taken by a model with other content."""


class ModelRecord(BaseModel):
    """One registered model.

    Attributes:
        name: the name specs use.
        owner: who registered it.
        sha256: hash over the copied files' relative paths and sha256s (weights, config,
            tokenizer), in path order; the store's object folder.
        format: ``hf`` (safetensors folder) or ``gguf`` (one GGUF file).
        gguf_file: the GGUF file's name inside the object folder (``gguf`` only).
        files: relative path -> sha256 of every copied file.
        tokenizer_sha256: fingerprint of the tokenizer's vocabulary and special tokens
            (:func:`workers.lm.loading.tokenizer_fingerprint`); equal for the same tokenizer
            loaded from a GGUF file or from a folder. None when it was not computed.
        vocab_size: the model's output vocabulary, when known.
        source: the path it was registered from (for people; never read back).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    owner: str = "local"
    sha256: str
    format: Literal["hf", "gguf"]
    gguf_file: str | None = None
    files: dict[str, str]
    bytes: int = Field(ge=0)
    tokenizer_sha256: str | None = None
    vocab_size: int | None = None
    created_at: str
    source: str = ""


def file_sha256(path: Path) -> str:
    """sha256 hex digest of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def content_sha256(files: dict[str, str]) -> str:
    """The model's hash: sha256 over ``relpath\\0sha256\\n`` lines sorted by path."""
    lines = "".join(f"{rel}\0{files[rel]}\n" for rel in sorted(files))
    return hashlib.sha256(lines.encode()).hexdigest()


def collect_files(path: Path) -> tuple[Literal["hf", "gguf"], list[Path]]:
    """The files a registration copies, and the model's format.

    Args:
        path: a ``.gguf`` file, or a Hugging Face model folder.

    Raises:
        ModelError: the path is missing; a pickle-based weight file is present (named);
            a folder has no ``config.json`` or no ``*.safetensors``; a file is neither.
    """
    path = Path(path)
    if not path.exists():
        raise ModelError(f"{path}: no such file or folder; give a Hugging Face model folder "
                         "(config.json + *.safetensors) or a .gguf file")
    if path.is_file():
        if path.suffix.lower() in PICKLE_SUFFIXES:
            raise ModelError(f"{path}: pickle-based weights are refused (loading them can run "
                             "code); convert them to safetensors or GGUF")
        if path.suffix.lower() != ".gguf":
            raise ModelError(f"{path}: not a .gguf file; give a GGUF file or a Hugging Face "
                             "model folder")
        return "gguf", [path]
    children = sorted(p for p in path.rglob("*") if p.is_file() and ".git" not in p.parts)
    pickled = [p for p in children if p.suffix.lower() in PICKLE_SUFFIXES]
    if pickled:
        raise ModelError(
            f"{pickled[0]}: pickle-based weights are refused (loading them can run code); "
            "remove the file or convert it to safetensors"
        )
    if not (path / "config.json").is_file():
        raise ModelError(f"{path / 'config.json'}: missing; a Hugging Face model folder needs "
                         "its config.json")
    weights = [p for p in children if p.suffix == ".safetensors"]
    if not weights:
        ggufs = [p for p in children if p.suffix.lower() == ".gguf"]
        hint = f" (register the GGUF file itself: {ggufs[0]})" if ggufs else ""
        raise ModelError(f"{path}: no *.safetensors weights{hint}")
    configs = [p for p in children if p.parent == path and p.name in HF_CONFIG_FILES]
    return "hf", sorted(set(weights) | set(configs))


class ModelStore(ObjectStore[ModelRecord]):
    """Registered models under ``root``: ``objects/<sha256>/files/...`` (the copied files,
    read-only afterwards), ``objects/<sha256>/meta.json`` (the ModelRecord at registration),
    ``names/<name>.json`` (the ModelRecord a name points to)."""

    kind = "model"
    record_model = ModelRecord

    def __init__(self, root: Path | str) -> None:
        super().__init__(Path(root).expanduser().resolve())

    @classmethod
    def invalid_name(cls, name: object) -> ModelError:
        return ModelError(f"model name {name!r}: use 1-64 characters of letters, digits, '.', '_' "
                          "or '-', starting with a letter or digit (never a path)")

    def not_found(self, message: str) -> ModelNotFound:
        return ModelNotFound(message)

    def files_dir(self, sha256: str) -> Path:
        """The folder of a model's copied files (``objects/<sha256>/files``)."""
        return self.object_dir(sha256) / "files"

    def model_path(self, record: ModelRecord) -> Path:
        """What ``from_pretrained`` is given: the files folder (with ``gguf_file`` for GGUF)."""
        return self.files_dir(record.sha256)

    def object_record(self, sha256: str) -> ModelRecord:
        """The record object ``sha256`` was registered with (its name may point elsewhere now)."""
        return ModelRecord.model_validate_json((self.object_dir(sha256) / META_FILE).read_text())

    def add(
        self, path: Path | str, *, name: str, owner: str = "local", replace: bool = False,
        fingerprint: Callable[[Path, str | None], tuple[str, int | None]] | None = None,
    ) -> ModelRecord:
        """Copy, hash and name a model.

        Args:
            path: a Hugging Face folder or a ``.gguf`` file.
            name: the name specs will use.
            owner: recorded with the model.
            replace: point an existing name at new content (the old files stay).
            fingerprint: ``(files_folder, gguf_file) -> (tokenizer_sha256, vocab_size)``,
                called on the copied files (the CLI passes the transformers-based one).

        Returns:
            The record; the same name with the same content is a no-op returning it.

        Raises:
            ModelError: see :func:`collect_files`; a bad name.
            ModelConflict: the name holds other content and ``replace`` is False.
        """
        self.check_name(name)
        source = Path(path).expanduser().resolve()
        kind, files = collect_files(source)
        base = source.parent if kind == "gguf" else source
        hashes = {str(f.relative_to(base)): file_sha256(f) for f in files}
        sha = content_sha256(hashes)
        with self.lock():
            existing = self.read_record(name)
            if existing is not None and existing.sha256 == sha:
                return existing
            if existing is not None and not replace:
                raise ModelConflict(
                    f"model name {name!r} is taken by other content (sha256 {existing.sha256[:12]}); "
                    "choose another --name or pass --replace"
                )
            obj = self.object_dir(sha)
            if not (obj / META_FILE).exists():
                self.land(self._copy(base, files), sha, META_FILE)
            tokenizer_sha, vocab = (None, None)
            gguf = files[0].name if kind == "gguf" else None
            if fingerprint is not None:
                tokenizer_sha, vocab = fingerprint(obj / "files", gguf)
            record = ModelRecord(
                name=name, owner=owner, sha256=sha, format=kind, gguf_file=gguf, files=hashes,
                bytes=sum(f.stat().st_size for f in files), tokenizer_sha256=tokenizer_sha,
                vocab_size=vocab, created_at=datetime.now(UTC).isoformat(timespec="seconds"),
                source=str(source),
            )
            atomic_write(obj / META_FILE, record.model_dump_json(indent=2))
            self.write_record(record)
            return record

    def _copy(self, base: Path, files: list[Path]) -> Path:
        """The files copied into a staging folder (``files/...``), for :meth:`land`."""
        staging = self.staging_dir("model")
        try:
            for f in files:
                target = staging / "files" / f.relative_to(base)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(f, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return staging

    def get(self, name: str) -> ModelRecord:
        """The record named ``name``; raises ModelNotFound listing what is registered."""
        record = self.read_record(name)
        if record is None:
            known = ", ".join(r.name for r in self.list()) or "none"
            raise ModelNotFound(f"model {name!r} is not registered under {self.root} (registered: "
                                f"{known}); add it with `ksweep model add PATH --name {name}`")
        return record

    def verify(self, record: ModelRecord) -> None:
        """Re-hash the stored files; raise ModelError naming the first file that changed."""
        folder = self.files_dir(record.sha256)
        for rel, expected in sorted(record.files.items()):
            path = folder / rel
            if not path.is_file() or file_sha256(path) != expected:
                raise ModelError(f"{path}: missing or changed since registration; register the "
                                 f"model again (`ksweep model add ... --name {record.name} --replace`)")


def check_dataset_tokenizer(dataset_name: str, dataset_tokenizer: str | None,
                            record: ModelRecord) -> None:
    """Refuse a dataset whose ids are not the model's tokenizer's.

    ``dataset_tokenizer`` is what the dataset store recorded when the dataset was tokenized
    (a string holding the tokenizer's 64-hex fingerprint, optionally with a name).

    Raises:
        ModelError: the dataset records no tokenizer, the model has no fingerprint, or the
            two fingerprints differ (both named).
    """
    if record.tokenizer_sha256 is None:
        raise ModelError(f"model {record.name!r} has no tokenizer fingerprint; register it again "
                         "with `ksweep model add PATH --name NAME --replace`")
    if not dataset_tokenizer:
        raise ModelError(
            f"dataset {dataset_name!r} records no tokenizer, so its ids cannot be checked against "
            f"model {record.name!r} (tokenizer {record.tokenizer_sha256[:12]}); register it from "
            "text (x_text/y_text) tokenized with the model's tokenizer")
    found = _HEX64.findall(dataset_tokenizer.lower())
    if record.tokenizer_sha256 not in found:
        raise ModelError(
            f"dataset {dataset_name!r} was tokenized by tokenizer {dataset_tokenizer!r}, but model "
            f"{record.name!r} uses tokenizer {record.tokenizer_sha256}; its ids would mean other "
            "tokens: register the dataset's text again with this model's tokenizer")


def record_summary(record: ModelRecord) -> dict[str, object]:
    """A one-line view for listings."""
    return {"name": record.name, "format": record.format, "sha256": record.sha256[:12],
            "bytes": record.bytes, "vocab_size": record.vocab_size,
            "tokenizer": (record.tokenizer_sha256 or "")[:12], "created_at": record.created_at}


def dumps(records: list[ModelRecord]) -> str:
    """Records as a JSON list (for ``ksweep model list --json``)."""
    return json.dumps([r.model_dump(mode="json") for r in records], indent=2)
