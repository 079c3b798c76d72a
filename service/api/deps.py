"""FastAPI dependencies: the process's services, and who the caller is.

Routes take them as the annotated types named here once: ``services: ServicesDep``,
``owner: OwnerDep`` (a valid bearer token, else 401), ``_reader: ReaderDep`` (reads are open
unless ``KSWEEP_READ_AUTH``).
"""

from __future__ import annotations

import hmac
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from cachetools import TTLCache
from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.api.errors import ProblemError
from service.settings import ADMIN_OWNER, Settings, hash_token

if TYPE_CHECKING:  # the store (SQLAlchemy), the supervisor, its launchers (httpx, psutil) and
    # the registries load when the app's lifespan builds them or a route asks, not at import
    from service.orchestrator.launchers import Launcher
    from service.orchestrator.supervisor import Supervisor
    from service.store.queries import Store
    from workers.datasets.store import DatasetStore
    from workers.lm.registry import ModelStore

bearer = HTTPBearer(auto_error=False, description="An API token: KSWEEP_API_TOKENS owner:token.")


class PageCache:
    """GET /sweeps pages, reused for ``ttl_s`` seconds while the store has not been written by
    this process: dashboards and ``ksweep status`` poll the same page over and over, and a
    page is no staler than the drivers' own ~1 s progress reports. ``ttl_s <= 0`` turns it off.
    Pages are kept as their JSON bytes. The list endpoint runs in FastAPI's thread pool and
    cachetools caches are not thread-safe, so every access holds a lock.
    """

    MAX_ENTRIES = 256

    def __init__(self, store: Store, ttl_s: float) -> None:
        self.store, self.ttl_s = store, ttl_s
        self._lock = threading.Lock()
        self._entries: TTLCache[tuple[Any, ...], tuple[int, Any]] | None = (
            TTLCache(maxsize=self.MAX_ENTRIES, ttl=ttl_s) if ttl_s > 0 else None)

    def get(self, key: tuple[Any, ...]) -> Any | None:
        """The page stored under ``key``, unless it expired or the store changed since."""
        if self._entries is None:
            return None
        with self._lock:
            entry = self._entries.get(key)
        if entry is None or entry[0] != self.store.generation:
            return None
        return entry[1]

    def put(self, key: tuple[Any, ...], value: Any, generation: int) -> None:
        """Keep ``value``, read from the store at ``generation`` (taken before the read: a write
        that lands meanwhile makes the page stale at once)."""
        if self._entries is not None:
            with self._lock:
                self._entries[key] = (generation, value)


@dataclass
class Services:
    settings: Settings
    store: Store
    launcher: Launcher
    supervisor: Supervisor
    tokens: dict[str, str]  # sha256(token) -> owner
    pages: PageCache

    @property
    def datasets(self) -> DatasetStore:
        """The dataset registry (``KSWEEP_DATA_ROOT``)."""
        from workers.datasets.store import DatasetStore

        return DatasetStore(self.settings.dataset_root)

    @property
    def models(self) -> ModelStore:
        """The model registry (``KSWEEP_MODEL_ROOT``)."""
        from workers.lm.registry import ModelStore

        return ModelStore(self.settings.resolved_model_root)


# Dependencies are `async def` so FastAPI runs them on the event loop instead of handing each
# to the thread pool (a pool round trip costs more than their work).
async def get_services(request: Request) -> Services:
    return request.app.state.services


ServicesDep = Annotated[Services, Depends(get_services)]


def bearer_credentials(authorization: str) -> HTTPAuthorizationCredentials | None:
    """An ``Authorization`` header's scheme and token; None when either is missing."""
    scheme, _, token = authorization.partition(" ")
    if not scheme or not token.strip():
        return None
    return HTTPAuthorizationCredentials(scheme=scheme, credentials=token.strip())


def owner_of(credentials: HTTPAuthorizationCredentials | None, services: Services) -> str | None:
    """The owner whose bearer token this is; None without one, or for an unknown token."""
    if credentials is None or credentials.scheme.lower() != "bearer":
        return None
    # The token's hash against every known hash in constant time (no early exit, no
    # short-circuiting comparison); the plain token is never stored, compared or logged.
    digest = hash_token(credentials.credentials)
    owner = None
    for known, name in services.tokens.items():
        if hmac.compare_digest(known, digest):
            owner = name
    return owner


def _unauthorized(detail: str) -> ProblemError:
    return ProblemError(401, "Unauthorized", detail, kind="unauthorized",
                        headers={"WWW-Authenticate": "Bearer"})


def _require_owner(credentials: HTTPAuthorizationCredentials | None, services: Services) -> str:
    if credentials is None:
        raise _unauthorized("this request needs 'Authorization: Bearer <token>' (KSWEEP_TOKEN)")
    owner = owner_of(credentials, services)
    if owner is None:
        raise _unauthorized("the bearer token is not valid")
    return owner


async def require_owner(
        services: ServicesDep,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> str:
    """The caller's owner name; 401 without a valid bearer token."""
    return _require_owner(credentials, services)


async def read_access(request: Request, services: ServicesDep) -> str | None:
    """Reads are open unless KSWEEP_READ_AUTH is set; then they need a valid token too.

    The header is read by hand rather than through ``bearer`` so that the OpenAPI document
    does not claim reads need a token when, by default, they do not.
    """
    credentials = bearer_credentials(request.headers.get("Authorization", ""))
    if not services.settings.read_auth:
        return owner_of(credentials, services)
    return _require_owner(credentials, services)


def may_read(authorization: str, services: Services) -> bool:
    """Whether :func:`read_access` lets a request with this ``Authorization`` header read
    (the hot reads ask before FastAPI sees the request)."""
    if not services.settings.read_auth:
        return True
    return owner_of(bearer_credentials(authorization), services) is not None


def may_act_on(owner: str, sweep_owner: str) -> bool:
    return owner in (sweep_owner, ADMIN_OWNER)


OwnerDep = Annotated[str, Depends(require_owner)]
ReaderDep = Annotated[str | None, Depends(read_access)]
