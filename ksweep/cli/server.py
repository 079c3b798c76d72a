"""``ksweep serve``: the REST service (uvicorn) with the supervisor that launches sweep drivers."""

from __future__ import annotations

import typer


def serve_command(
    host: str = typer.Option(None, help="Interface (default KSWEEP_HOST, 127.0.0.1)."),
    port: int = typer.Option(None, help="Port (default KSWEEP_PORT, 8000)."),
) -> None:
    """Run the REST service (uvicorn) with the supervisor that launches sweep drivers."""
    from workers.imports import heavy_imports

    with heavy_imports():  # uvicorn, FastAPI, SQLAlchemy: no collector passes while they load
        import uvicorn

        from service.api.app import create_app

    from service.settings import get_settings

    settings = get_settings()
    app = create_app(settings)
    uvicorn.run(app, host=host or settings.host, port=port if port is not None else settings.port,
                log_level="info", access_log=settings.access_log,
                timeout_graceful_shutdown=5)
