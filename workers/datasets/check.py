"""Validate one uploaded file in a child process under a memory limit, and stage it.

``python -m workers.datasets.check --input F --format parquet --source-name NAME --root R``
caps its own address space (``RLIMIT_AS``) before pyarrow is imported, reads and canonicalizes
the file (text with the registered model ``--tokenizer-model`` of ``--model-root`` when given,
else byte-level), stages the canonical table in the store's ``tmp/`` and prints one JSON line:
``{"ok": true, "staged": {...}}`` or ``{"ok": false, "error": {file, column, row, message, fix}}``.
A child that dies (out of memory, killed at the timeout) prints nothing: the caller says so.
The service (:mod:`service.api.routes.datasets`) runs it; nothing of the file runs in the service.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
from typing import TYPE_CHECKING

from workers.datasets.limits import CHILD_ENV, EXIT_OUT_OF_MEMORY, EXIT_REFUSED

if TYPE_CHECKING:  # transformers loads only when a tokenizer is asked for
    from workers.lm.tokenizer import ModelTextTokenizer

__all__ = ["CHILD_ENV", "EXIT_OUT_OF_MEMORY", "EXIT_REFUSED", "main"]


def _emit(payload: dict[str, object]) -> None:
    # Peak resident memory of this process (Linux reports KiB), for the log and the benchmark.
    payload["max_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    sys.stdout.write(json.dumps(payload) + "\n")
    sys.stdout.flush()


def _model_tokenizer(model_root: str | None, name: str) -> ModelTextTokenizer:
    """The registered model's tokenizer; a missing or changed model is a DatasetError."""
    from workers.datasets.limits import DatasetError
    from workers.lm.registry import ModelError
    from workers.lm.tokenizer import ModelTextTokenizer

    try:
        return ModelTextTokenizer.registered(model_root or ".", name)
    except ModelError as error:
        raise DatasetError(str(error), file=None, column="tokenizer", row=None,
                           fix="name a model `ksweep model list` shows") from None


def main(argv: list[str] | None = None) -> int:
    """Validate and stage; the exit code is 0 (staged), 2 (refused) or 3 (out of memory)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--input", required=True)
    parser.add_argument("--format", required=True, choices=("parquet", "arrow", "jsonl"))
    parser.add_argument("--source-name", required=True)
    parser.add_argument("--root", required=True)
    parser.add_argument("--limits", default="{}", help="DatasetLimits as JSON")
    parser.add_argument("--memory-bytes", type=int, default=0, help="RLIMIT_AS; 0: none")
    parser.add_argument("--staging-id", default=None, help="tmp/staged.<id> (32 hex digits)")
    parser.add_argument("--tokenizer-model", default=None, help="a registered model's name")
    parser.add_argument("--model-root", default=None, help="the model store (with the above)")
    args = parser.parse_args(argv)
    if args.memory_bytes > 0:
        resource.setrlimit(resource.RLIMIT_AS, (args.memory_bytes, args.memory_bytes))
    os.environ.update(CHILD_ENV)
    try:
        import pyarrow as pa

        from workers.datasets.limits import DatasetError, DatasetLimits
        from workers.datasets.store import DatasetStore
        from workers.datasets.table import canonicalize, read_table, tokenizer_of

        limits = DatasetLimits.model_validate_json(args.limits)
        try:
            table = read_table(args.input, limits, fmt=args.format, source_name=args.source_name)
            tokenizer = (None if args.tokenizer_model is None
                         else _model_tokenizer(args.model_root, args.tokenizer_model))
            canonical = canonicalize(table, args.source_name, limits, tokenizer=tokenizer)
            del table
            staged = DatasetStore(args.root).stage(canonical, tokenizer=tokenizer_of(canonical),
                                                   staging_id=args.staging_id)
        except DatasetError as err:
            _emit({"ok": False, "error": err.to_dict()})
            return EXIT_REFUSED
        except pa.ArrowMemoryError:
            raise MemoryError from None
        _emit({"ok": True, "staged": staged.model_dump(mode="json")})
        return 0
    except MemoryError:
        _emit({"ok": False, "out_of_memory": True})
        return EXIT_OUT_OF_MEMORY


if __name__ == "__main__":
    sys.exit(main())
