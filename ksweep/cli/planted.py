"""``ksweep data plant SOURCE``: a planted positive control, three datasets a sweep can name.

The logic is :mod:`workers.datasets.planted` (torch-free); this reads the source from the local
store, gives it a base (a unigram of the train split, or a registered causal LM with
``--model``: torch, imported then), registers ``<prefix>-concentrated``, ``-diffuse`` and
``-null`` in the same store and prints the matching table (docs/guide/planted-control.md).
"""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.table import Table

from ksweep.cli.client import console
from ksweep.cli.common import default_data_root, default_model_root, default_sweep_root


def _refuse(message: str) -> typer.Exit:
    console.print(f"[red]{message}[/red]", highlight=False)
    return typer.Exit(2)


def lm_base(name: str, record: Any) -> Any:
    """A :data:`workers.datasets.planted.BaseFit` from the registered causal LM ``name`` (its b_t
    of any rows, memoised by row: the variants share most of theirs)."""
    from workers.lm.loading import bos_token_id, load_registered
    from workers.lm.registry import ModelError, ModelStore, check_dataset_tokenizer
    from workers.lm.surprisal import token_surprisal

    store = ModelStore(default_model_root())
    try:
        model_record = store.get(name)
        check_dataset_tokenizer(record.name, record.tokenizer, model_record)
    except ModelError as error:
        raise _refuse(str(error)) from None
    model, tokenizer = load_registered(store, model_record)
    bos = bos_token_id(model, tokenizer)
    memo: dict[tuple, Any] = {}

    def base(_xs: Any, _ys: Any, _split: Any) -> Any:  # a pretrained LM fits nothing
        def score(xs: Any, ys: Any) -> list:
            keys = [(tuple(x), tuple(y)) for x, y in zip(xs, ys, strict=True)]
            missing = [k for k in dict.fromkeys(keys) if k not in memo]
            if missing:
                rows = token_surprisal(model, [list(k[0]) for k in missing],
                                       [list(k[1]) for k in missing], bos_id=bos, progress=False)
                memo.update(zip(missing, rows, strict=True))
            return [memo[k] for k in keys]

        return score

    return base


def _cell(stats: dict[str, float]) -> str:
    return f"{stats['mean']:.3f} [{stats['q25']:.3f}, {stats['q50']:.3f}, {stats['q75']:.3f}]"


def print_table(summaries: list[dict[str, Any]], names: dict[str, str], tokens: list[int]) -> None:
    """The matching table: one row per variant."""
    table = Table("variant", "dataset", "rows planted\ntrain/val/test", "kappa before\nmean [q25, q50, q75]",
                  "kappa after\nmean [q25, q50, q75]", "kappa after,\nother rows", "in declared\ngroup",
                  "I(label; evidence)\nnats (train)",
                  title=f"planted control: evidence tokens {tokens[0]} (label 0), {tokens[1]} (label 1)")
    for s in summaries:
        planted = s["rows_planted"]
        table.add_row(s["variant"], names[s["variant"]],
                      f"{planted['train']}/{planted['val']}/{planted['test']}",
                      _cell(s["kappa_before"]), _cell(s["kappa_after"]),
                      f"{s['kappa_after_other_rows']['mean']:.3f}",
                      f"{s['declared_group']} {s['share_in_declared_group']:.2f}",
                      f"{s['information_nats']:.4f} ({s['information_train_nats']:.4f})")
    console.print(table)


def plant_command(
    source: str = typer.Argument(..., help="A registered dataset of the local store."),
    alpha: float = typer.Option(1.0, "--alpha", min=0.0, help="The kappa_alpha that chooses the "
                                "carriers and is reported."),
    fraction: float = typer.Option(0.25, "--fraction", help="Share of each (split, label) cell "
                                   "that carries evidence, in (0, 0.5]."),
    seed: int = typer.Option(0, "--seed", help="Labels, positions and the null's carriers."),
    tokens: str | None = typer.Option(None, "--tokens", help="The evidence ids of label 0 and "
                                      "label 1, 'A,B' (default: the source's two rarest ids)."),
    position: str = typer.Option("random", "--position", help="Where the evidence goes in y: "
                                 "start, end or random (seeded, the same in every variant)."),
    surprisal: str = typer.Option("matched", "--surprisal", help="The planted token's b_t: "
                                  "matched (the value that leaves the row's kappa unchanged; "
                                  "train with base.kind: precomputed) or base (the base scores it)."),
    model: str | None = typer.Option(None, "--model", help="b_t from this registered causal LM "
                                     "(`ksweep model add`); default: a unigram of the train split."),
    prefix: str | None = typer.Option(None, "--prefix", help="Names <prefix>-concentrated, "
                                      "-diffuse, -null (default: <SOURCE>-planted)."),
    replace: bool = typer.Option(False, "--replace", help="Point existing names at new content."),
    as_json: bool = typer.Option(False, "--json", help="Print the summaries as JSON."),
) -> None:
    """Build and register the planted control's three variants (local store)."""
    from workers.data.config import DatasetDataConfig
    from workers.datasets.limits import DatasetError
    from workers.datasets.planted import VARIANTS, plant, unigram_base, variant_table
    from workers.datasets.source import split_assignment
    from workers.datasets.store import DatasetConflict, DatasetNotFound, DatasetStore
    from workers.datasets.table import canonicalize

    if position not in ("start", "end", "random"):
        raise _refuse(f"--position {position!r}: use start, end or random")
    if surprisal not in ("matched", "base"):
        raise _refuse(f"--surprisal {surprisal!r}: use matched or base")
    try:
        pair = tuple(int(t) for t in tokens.split(",")) if tokens else None
    except ValueError:
        raise _refuse(f"--tokens {tokens!r}: give two ids, e.g. --tokens 17,23") from None
    if pair is not None and len(pair) != 2:
        raise _refuse(f"--tokens {tokens!r}: give exactly two ids, one per label")
    store = DatasetStore(default_data_root())
    try:
        record = store.get(source)
        table = store.open_table(record.sha256)
        split = split_assignment(table, DatasetDataConfig(dataset=source))
    except (DatasetNotFound, DatasetError) as error:
        raise _refuse(str(error)) from None
    ys = table.column("y").to_pylist()
    xs = table.column("x").to_pylist() if "x" in table.column_names else [[] for _ in ys]
    base = lm_base(model, record) if model else unigram_base
    try:
        planted = plant(xs, ys, split, alpha=alpha, fraction=fraction, seed=seed, tokens=pair,  # type: ignore[arg-type]
                        position=position, surprisal=surprisal, base=base)  # type: ignore[arg-type]
    except ValueError as error:
        raise _refuse(f"{source}: {error}") from None
    names = {v: f"{prefix or source + '-planted'}-{v}" for v in VARIANTS}
    summaries = []
    for variant in VARIANTS:
        entry = planted.variants[variant]
        try:
            canonical = canonicalize(variant_table(entry, planted, xs, split), f"{source} ({variant})")
            registered = store.add(canonical, name=names[variant], owner=record.owner,
                                   tokenizer=record.tokenizer, replace=replace)
        except DatasetError as error:
            raise _refuse(str(error)) from None
        except DatasetConflict as error:
            raise _refuse(f"{error} (--replace)") from None
        summaries.append({**entry.summary, "dataset": names[variant], "sha256": registered.sha256})
    result = {"source": source, "source_sha256": record.sha256, "config": planted.config,
              "base": f"causal LM {model}" if model else "unigram of the train split",
              "variants": summaries}
    if as_json:
        print(json.dumps(result, indent=1))
        return
    print_table(summaries, names, planted.config["tokens"])
    console.print(f"base: {result['base']}; planted token's b_t: {surprisal}; alpha {alpha:g}; "
                  f"fraction {fraction:g}; seed {seed}; position {position}. Registered in the local store {default_data_root()} "
                  f"(sweep root {default_sweep_root()}); name them in a spec as "
                  "template.data: {dataset: NAME} with base.kind: precomputed to train on these "
                  "b_t (the kappa shown).", highlight=False)
