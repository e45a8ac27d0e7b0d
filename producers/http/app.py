"""The gateway's ASGI app and its server: Starlette on uvicorn.

    tandem http --port 8000            # or: serve(settings, host, port, limits, token)

One process holds one AsyncClient: one Redis pool and one result subscription for all
its requests. Run as many processes as you like behind a load balancer; none keeps
state of its own.
"""

from __future__ import annotations

import contextlib
import importlib.util

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tandem.broker.settings import Settings
from tandem.producers.aio import AsyncClient
from tandem.producers.http import oip
from tandem.producers.http.embeddings import embeddings
from tandem.producers.http.gateway import Gateway, HTTPError, Limits, endpoint


@endpoint("/metrics", guarded=False)
async def metrics(gateway: Gateway, request: Request) -> Response:
    return Response(generate_latest(gateway.metrics.registry), media_type=CONTENT_TYPE_LATEST)


async def not_found(request: Request, exc: Exception) -> Response:
    return HTTPError(404, f"no such endpoint: {request.method} {request.url.path[:200]}").response()


async def not_allowed(request: Request, exc: Exception) -> Response:
    return HTTPError(405, f"{request.method} is not allowed on {request.url.path[:200]}").response()


def make_app(settings: Settings, limits: Limits | None = None, token: str | None = None):
    """The ASGI app; its AsyncClient starts and stops with it (ASGI lifespan)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        client = AsyncClient(settings)
        await client.start()
        app.state.gateway = Gateway(client, limits or Limits(), token)
        try:
            yield
        finally:
            await client.close()

    model = "/v2/models/{name}"
    versioned = "/v2/models/{name}/versions/{version}"
    routes = [
        Route("/v2", oip.server_metadata),
        Route("/v2/health/live", oip.live),
        Route("/v2/health/ready", oip.ready),
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        Route("/metrics", metrics),
    ]
    for base in (model, versioned):
        routes += [
            Route(base, oip.model_metadata),
            Route(base + "/ready", oip.model_ready),
            Route(base + "/config", oip.model_config),
            Route(base + "/infer", oip.infer, methods=["POST"]),
        ]
    return Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={404: not_found, 405: not_allowed},
    )


def serve(
    settings: Settings,
    host: str = "127.0.0.1",
    port: int = 8000,
    limits: Limits | None = None,
    token: str | None = None,
) -> None:
    """Serve until SIGINT or SIGTERM: uvicorn with uvloop and httptools where installed."""
    import uvicorn

    limits = limits or Limits()
    uvicorn.run(
        make_app(settings, limits, token),
        host=host,
        port=port,
        loop="uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        http="httptools" if importlib.util.find_spec("httptools") else "h11",
        # A backstop past the gateway's own bound (which answers 503 with Retry-After).
        limit_concurrency=limits.max_concurrency * 4,
        timeout_keep_alive=30,
        access_log=False,
        log_level=settings.loglevel.lower(),
    )
