"""The JSON bodies of the two hot reads, GET /sweeps/{id} and GET /sweeps: one builder each,
called by the FastAPI routes (:mod:`service.api.routes.sweeps`) and by the fast path ahead of
FastAPI (:mod:`service.api.hot_reads`), so both answer the same bytes."""

from __future__ import annotations

from service.api import documents
from service.api.deps import Services

__all__ = ["list_page_body", "sweep_body"]


def sweep_body(services: Services, sweep_id: str) -> bytes | None:
    """GET /sweeps/{id}'s JSON body, or None when there is no such sweep."""
    row = services.store.summary(sweep_id)
    return None if row is None else documents.sweep_json(row, services.settings.mlflow_ui_url)


def list_page_body(services: Services, state: str | None, owner: str | None, limit: int,
                   offset: int) -> bytes:
    """GET /sweeps's JSON body (from the page cache while it holds the page)."""
    key = (state, owner, limit, offset)
    cached = services.pages.get(key)
    if cached is None:
        generation = services.store.generation
        page = services.store.list_sweeps(state=state, owner=owner, limit=limit, offset=offset)
        cached = documents.page_json(page.items, page.total, limit, offset,
                                     services.settings.mlflow_ui_url)
        services.pages.put(key, cached, generation)
    return cached
