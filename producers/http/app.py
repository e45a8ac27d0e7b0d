"""The gateway's ASGI app and its server: Starlette on uvicorn, and gRPC beside it.

    tandem http --port 8000 --grpc-port 8001   # or: serve(settings, host, port, ...)

One process holds one AsyncClient: one Redis pool and one result subscription for all
its requests, over HTTP and gRPC (producers/grpc/, on the same event loop). Run as many
processes as you like behind a load balancer; none keeps state of its own.
"""

from __future__ import annotations

import contextlib
import importlib.util

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import Response
from starlette.routing import Route, Router

from tandem.broker import tracing
from tandem.broker.settings import Settings
from tandem.producers.aio import AsyncClient
from tandem.producers.http import oip
from tandem.producers.http.embeddings import embeddings
from tandem.producers.http.gateway import Call, Gateway, HTTPError, Limits, endpoint

METHODS = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]
#: Seconds the gRPC server lets calls in progress finish when the gateway stops.
STOP_GRACE_S = 5.0


@endpoint("/metrics", guarded=False)
async def metrics(gateway: Gateway, call: Call) -> Response:
    return Response(generate_latest(gateway.metrics.registry), media_type=CONTENT_TYPE_LATEST)


async def not_found(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    text = f"no such endpoint: {scope['method']} {scope['path'][:200]}"
    await HTTPError(404, text).response()(scope, receive, send)


def make_app(
    settings: Settings,
    limits: Limits | None = None,
    token: str | None = None,
    grpc_address: tuple[str, int] | None = None,
):
    """The ASGI app: Starlette's router alone (each endpoint answers its own errors, so
    Starlette's error middleware would only cost time). Its AsyncClient, and the gRPC
    server on grpc_address if given, start and stop with it, in the ASGI lifespan, whose
    state every request sees."""

    @contextlib.asynccontextmanager
    async def lifespan(app):
        client = AsyncClient(settings)
        await client.start()
        gateway = Gateway(client, limits or Limits(), token)
        grpc_server = None
        try:
            if grpc_address:
                from tandem.producers.grpc import server

                grpc_server = await server.start(gateway, *grpc_address)
            yield {"gateway": gateway}
        finally:
            if grpc_server is not None:
                await grpc_server.stop(STOP_GRACE_S)
            await client.close()

    model = "/v2/models/{name}"
    versioned = "/v2/models/{name}/versions/{version}"
    # Starlette tries routes in order: the ones every request takes come first.
    routes = [(model + "/infer", oip.infer), (versioned + "/infer", oip.infer)]
    routes += [
        ("/v1/embeddings", embeddings),
        ("/v2", oip.server_metadata),
        ("/v2/health/live", oip.live),
        ("/v2/health/ready", oip.ready),
        ("/metrics", metrics),
    ]
    for base in (model, versioned):
        routes += [
            (base, oip.model_metadata),
            (base + "/ready", oip.model_ready),
            (base + "/config", oip.model_config),
        ]
    # Every method reaches the endpoint, which answers a wrong one with a JSON 405.
    return Router(
        [Route(path, handler, methods=METHODS) for path, handler in routes],
        lifespan=lifespan,
        default=not_found,
    )


def serve(
    settings: Settings,
    host: str = "127.0.0.1",
    port: int = 8000,
    limits: Limits | None = None,
    token: str | None = None,
    grpc_port: int = 0,
) -> None:
    """Serve until SIGINT or SIGTERM: uvicorn with uvloop and httptools where installed,
    and gRPC on grpc_port unless it is 0."""
    import uvicorn

    limits = limits or Limits()
    tracing.tracer("tandem-gateway")  # set up first: a misconfigured exporter stops it here
    uvicorn.run(
        make_app(settings, limits, token, (host, grpc_port) if grpc_port else None),
        host=host,
        port=port,
        loop="uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        http="httptools" if importlib.util.find_spec("httptools") else "h11",
        # A backstop past the gateway's own bound (which answers 503 with Retry-After).
        limit_concurrency=limits.max_concurrency * 4,
        timeout_keep_alive=30,
        proxy_headers=False,  # nothing here reads the client's address
        access_log=False,
        log_level=settings.loglevel.lower(),
    )
