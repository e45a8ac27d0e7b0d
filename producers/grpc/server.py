"""The gRPC server beside the HTTP one: grpcio's asyncio server on the gateway's event
loop, with the inference service and the standard health service (grpc.health.v1, what
Kubernetes' gRPC probes and grpc-health-probe ask)."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2_grpc as pb2_grpc

from tandem.producers.grpc.service import Service
from tandem.producers.http.gateway import Gateway

#: The services the health check answers for: the server as a whole ("") and inference.
SERVICES = ("", "inference.GRPCInferenceService")
Status = health_pb2.HealthCheckResponse.ServingStatus


class Health(health_pb2_grpc.HealthServicer):
    """SERVING while the gateway is ready (Redis answers, the result reader runs)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def Check(self, request, context):
        if request.service not in SERVICES:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        ready = await self.gateway.not_ready() is None
        status = Status.SERVING if ready else Status.NOT_SERVING
        return health_pb2.HealthCheckResponse(status=status)


async def start(gateway: Gateway, host: str, port: int) -> grpc.aio.Server:
    """Listen on host:port and serve until stopped; OSError if the port cannot be bound.
    A message larger than the gateway's body limit is refused (RESOURCE_EXHAUSTED)."""
    limit = gateway.limits.max_body_bytes
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 0),
        ]
    )
    pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Service(gateway), server)
    health_pb2_grpc.add_HealthServicer_to_server(Health(gateway), server)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if server.add_insecure_port(address) == 0:
        raise OSError(f"cannot listen for gRPC on {address}")
    await server.start()
    return server
