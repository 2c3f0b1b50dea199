"""The standard gRPC health status follows the verdict it is given, over a real in-process gRPC server."""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from orchestrator.api.standard_health import SERVICE_NAME, StandardHealth

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


def test_the_status_follows_the_check_and_turns_not_serving_on_stop():
    verdicts = {"now": True}

    async def check() -> bool:
        if verdicts["now"] is None:
            raise RuntimeError("Triton is down")
        if verdicts["now"] == "hang":
            await asyncio.sleep(60)
        return verdicts["now"]

    async def scenario() -> list:
        server = grpc.aio.server()
        standard = StandardHealth(check, interval_s=0.05)
        standard.add_to(server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        await standard.start()
        seen = []
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)

            async def status(name: str = "") -> int:
                return (await stub.Check(health_pb2.HealthCheckRequest(service=name))).status

            seen.append((await status(), await status(SERVICE_NAME)))
            for verdict in (False, None, True, "hang"):
                verdicts["now"] = verdict
                await asyncio.sleep(0.3 if verdict != "hang" else 1.6)  # a hanging check times out after 1 s
                seen.append(await status())
            verdicts["now"] = True
            await asyncio.sleep(1.8)  # the hanging check's timeout, then a check that answers
            seen.append(await status())
            await standard.stop()
            seen.append((await status(), await status(SERVICE_NAME)))
            await asyncio.sleep(0.2)
            seen.append(await status())  # stays NOT_SERVING: no check runs any more
        await server.stop(None)
        return seen

    assert asyncio.run(scenario()) == [
        (SERVING, SERVING), NOT_SERVING, NOT_SERVING, SERVING, NOT_SERVING, SERVING, (NOT_SERVING, NOT_SERVING), NOT_SERVING]
