"""MkDocs hook: drop nav entries to pages other branches add, until those pages exist.

``mkdocs --strict`` fails on a nav entry whose file is missing. The pages below are written in
parallel work; each nav entry naming one stays in mkdocs.yml and is dropped here only while its
file is absent, so the entry appears by itself once the page lands. A section left empty is
dropped with it. Any other missing page still fails the build.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

OPTIONAL_PAGES = frozenset({
    "guide/datasets.md",
    "guide/language-models.md",
    "guide/client.md",
    "development.md",
})


def _keep(item: Any, docs_dir: Path) -> Any:
    """The nav item without absent optional pages, or None when nothing of it is left."""
    if isinstance(item, str):
        return None if item in OPTIONAL_PAGES and not (docs_dir / item).is_file() else item
    if isinstance(item, dict):
        kept = {title: _keep(value, docs_dir) for title, value in item.items()}
        kept = {title: value for title, value in kept.items() if value is not None}
        return kept or None
    if isinstance(item, list):
        kept_items = [kept for entry in item if (kept := _keep(entry, docs_dir)) is not None]
        return kept_items or None
    return item


def on_config(config: Any) -> Any:
    """Filter ``config.nav`` in place of a plugin (MkDocs calls this once, before reading files)."""
    if config.nav:
        config.nav = _keep(config.nav, Path(config.docs_dir)) or []
    return config
