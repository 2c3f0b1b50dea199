"""The ecosystem's gRPC health checking and server reflection, beside ThinkServe's own Health RPC.

Kubernetes gRPC probes, grpc_health_probe and load balancers ask `grpc.health.v1.Health`; grpcurl and Postman
discover the API by server reflection. Both answer without a token (a probe has none), and say nothing a
client could not learn from the address: SERVING or NOT_SERVING, and the schema. The status follows the own
Health RPC's verdict (every required model ready in Triton and its circuit breaker closed, and the server not
draining), checked every `server.health_interval_s`, for the whole server ("") and for the ThinkServe service
by name; a stopping server turns NOT_SERVING at once, before it drains.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable, Optional

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from .protos import pb

log = logging.getLogger("thinkserve.health")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["ThinkServe"].full_name  # thinkserve.v1.ThinkServe
SERVED_NAMES = ("", SERVICE_NAME)  # "": the server as a whole, what a probe without a service name asks


class StandardHealth:
    """grpc.health.v1.Health and reflection on a grpc.aio server, the status kept current in the background."""

    def __init__(self, serving: Callable[[], Awaitable[bool]], interval_s: float):
        self.serving = serving  # the own Health RPC's verdict
        self.interval_s = interval_s
        self.servicer = health.aio.HealthServicer()
        self._task: Optional[asyncio.Task] = None

    def add_to(self, server: grpc.aio.Server) -> None:
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME), server
        )

    async def start(self) -> None:
        await self.update()
        self._task = asyncio.create_task(self._follow(), name="standard-health")

    async def update(self) -> None:
        try:
            serving = await asyncio.wait_for(self.serving(), max(1.0, self.interval_s))
        except Exception as error:  # noqa: BLE001 - a check that fails or hangs says NOT_SERVING, and why, in the log
            log.warning("health check failed: %s", error or type(error).__name__)
            serving = False
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in SERVED_NAMES:
            await self.servicer.set(name, status)

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.update()

    async def stop(self) -> None:
        """NOT_SERVING from now on (watchers are told), whatever a check would say: the server is stopping."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.servicer.enter_graceful_shutdown()


def probe(address: str, timeout_s: float = 5.0, service: str = "") -> str:
    """Ask a server's grpc.health.v1 service (plaintext, no token), as grpc_health_probe does: the status name
    (SERVING, NOT_SERVING, ...), or UNREACHABLE with gRPC's reason."""
    with grpc.insecure_channel(address) as channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError as error:
            return f"UNREACHABLE: {error.code().name}: {error.details()}"
    return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
