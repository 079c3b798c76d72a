"""The FastAPI application: ``/api/v1`` routers, problem details, the supervisor's lifespan."""

from __future__ import annotations

import logging
import os
import secrets
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from service.api.deps import PageCache, Services
from service.api.errors import BodySizeLimit, install_error_handlers
from service.api.hot_reads import HotReads
from service.api.links import add_links
from service.api.routes import datasets, growth, health, history, objectives, sweeps
from service.settings import LOCAL_OWNER, Settings, get_settings, hash_token

API_PREFIX = "/api/v1"
log = logging.getLogger("ksweep.service")


def local_token(settings: Settings) -> str:
    """The generated token of a service with no KSWEEP_API_TOKENS (owner ``local``), kept in
    ``<sweep_root>/api-token`` with mode 0600 so that only this user's CLI can read it."""
    path = settings.local_token_path
    if path.is_file():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
    return token


def build_services(settings: Settings) -> Services:
    # The store (SQLAlchemy), the supervisor and its launchers (httpx, psutil) load here, in the
    # lifespan: importing the app (tests, the OpenAPI document) does not need them.
    from service.orchestrator.launchers import make_launcher
    from service.orchestrator.supervisor import Supervisor
    from service.store.queries import Store

    tokens = settings.configured_tokens()
    if not tokens:
        tokens = {hash_token(local_token(settings)): LOCAL_OWNER}
        log.warning("KSWEEP_API_TOKENS is empty: owner %r uses the token in %s",
                    LOCAL_OWNER, settings.local_token_path)
    store = Store(settings.store_url)
    launcher = make_launcher(settings)
    return Services(settings=settings, store=store, launcher=launcher,
                    supervisor=Supervisor(settings, store, launcher), tokens=tokens,
                    pages=PageCache(store, settings.list_cache_s))


class ServiceApp(FastAPI):
    """FastAPI, with the hot reads (:mod:`service.api.hot_reads`) answered before its layers."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hot_reads = HotReads(API_PREFIX)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not await self.hot_reads.answer(scope, getattr(self.state, "services", None), send):
            await super().__call__(scope, receive, send)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: ServiceApp):
        services = build_services(settings)
        app.state.services = services
        services.supervisor.lead_and_tick()  # reconcile before the first request (if leading)
        services.supervisor.start()
        try:
            yield
        finally:
            services.supervisor.stop()
            app.hot_reads.threads.close()
            services.store.close()

    app = ServiceApp(
        title="kappa-sweep",
        version="0.1.0",
        description="Sweeps over the concentration knob alpha and loss stacks for CVAEs: submit "
                    "a spec, follow its trials, read the comparison report; runs land in MLflow.",
        lifespan=lifespan,
    )
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes,
                       streamed=(f"{API_PREFIX}/datasets",))
    for router in (sweeps.router, growth.router, history.router, datasets.router, objectives.router,
                   health.router):
        app.include_router(router, prefix=API_PREFIX)
    generate = app.openapi
    app.openapi = lambda: add_links(generate(), API_PREFIX)  # type: ignore[method-assign]
    return app
