"""A running deployment: Triton (launched here, or an existing one), the Triton client, the knowledge base
and the gRPC server, started in order and stopped in reverse. `serve`, the demo and the tests all use it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import threading
from typing import AsyncIterator, Callable, Optional

import grpc
from starlette.applications import Starlette

from ..api.gateway import Gateway
from ..api.http_server import HttpServer, check_exposure, server_credentials
from ..api.decoding import add_service
from ..api.openai_http import openai_routes
from ..api.rest_http import rest_routes
from ..api.protos import pb
from ..api.standard_health import StandardHealth
from ..api.service import ThinkServeService
from ..config import Settings
from ..errors import ConfigurationError, TritonUnavailableError
from ..knowledge.ingest import Ingestor
from ..knowledge.storage.indexes import index_spec
from ..knowledge.storage.registry import KnowledgeBase
from ..observability.metrics import ServiceMetrics
from ..observability.tracing import Tracing, setup_tracing
from ..pipeline.query import QueryPipeline
from ..triton.client import TritonClient
from ..models.contracts import OCR, ModelContract, all_contracts
from ..triton.launcher import TritonServer
from ..triton.supervisor import TritonSupervisor
from ..triton.models import TritonModels

log = logging.getLogger("thinkserve.deployment")


def required_for(settings: Settings) -> tuple[ModelContract, ...]:
    """Every contract the settings use: all of them, less the OCR model when ingest reads no text from images."""
    return tuple(c for c in all_contracts() if not (c.name == OCR.name and settings.ingest.ocr == "off"))


class Deployment:
    def __init__(
        self, settings: Settings, required_models: Optional[tuple[ModelContract, ...]] = None, span_exporter=None
    ):
        """`required_models`: the models that must be ready (default: every contract, the OCR model unless
        ingest.ocr is "off": a repository built with `thinkserve-build --no-ocr` serves without it)."""
        check_exposure(settings)
        self.settings = settings
        self.required_models = required_models if required_models is not None else required_for(settings)
        self.triton: Optional[TritonServer] = None
        self.triton_client: Optional[TritonClient] = None
        # restarts our Triton / reloads a model whose stub died (with triton.url: watches readiness only)
        self.supervisor: Optional[TritonSupervisor] = None
        self.server: Optional[grpc.aio.Server] = None
        self.standard_health: Optional[StandardHealth] = None  # grpc.health.v1 and reflection, unauthenticated
        self.address: str = ""
        self.gateway: Optional[Gateway] = None
        self.http: Optional[HttpServer] = None
        self.http_address: str = ""
        self.tracing: Optional[Tracing] = None
        self.knowledge: Optional[KnowledgeBase] = None
        self._span_exporter = span_exporter  # an OpenTelemetry SpanExporter to use instead of the configured one

    @property
    def triton_url(self) -> str:
        return self.triton.endpoints.grpc if self.triton else self.settings.triton.url

    async def start(self, progress: Callable[[str], None] = log.info) -> str:
        """Start everything; returns the orchestrator's gRPC address (host:port)."""
        try:
            sys.setswitchinterval(self.settings.server.switch_interval_ms / 1000)  # see ServerSettings
            storage = self.settings.storage
            # first: a second writer of the data folder refuses before it launches anything
            self.knowledge = knowledge = KnowledgeBase(
                storage.data_dir, index_spec(self.settings.index), read_only=storage.read_only,
                warm=storage.warm_snapshots, retain_dropped_s=storage.retain_dropped_s,
                index_write_vectors=storage.index_write_vectors, publish_before_graph_rows=storage.publish_before_graph_rows,
            )
            if storage.read_only:
                knowledge.follow(storage.follow_interval_s)
                progress(f"read replica of {storage.data_dir}: following its writer every {storage.follow_interval_s:g} s")
            if not self.settings.triton.url:
                progress("starting Triton (loading every model of the repository) ...")
                self.triton = TritonServer(self.settings.triton, self.required_models)
                endpoints = await asyncio.to_thread(self.triton.start)
                progress(f"Triton ready on {endpoints.grpc} (log: {self.triton.log_path})")
            self.triton_client = TritonClient.from_settings(self.settings.triton, self.triton_url)
            if not await self.triton_client.server_ready():
                raise TritonUnavailableError(f"Triton at {self.triton_url} is not ready")
            if self.settings.triton.supervise:
                self.supervisor = TritonSupervisor(self.settings.triton, self.triton_client, self.triton)
                self.supervisor.start()
            models = TritonModels(self.triton_client)
            ingestor = Ingestor(
                knowledge, models, self.settings.ingest, self.settings.tokenizer_file, self.settings.retrieval.relation_seeds
            )
            self.tracing = setup_tracing(self.settings.observability, self._span_exporter)
            pipeline = QueryPipeline(self.settings, models, knowledge, ingestor.tokenizer, self.tracing.tracer)
            metrics = ServiceMetrics()
            metrics.track_triton(self.triton_client.health_snapshot, lambda: self.supervisor and self.supervisor.status())
            metrics.track_ingest(ingestor.progress.figures, ingestor.progress.totals)
            self.gateway = Gateway(self.settings, pipeline, metrics, self.tracing.tracer)
            service = ThinkServeService(
                self.settings, models, ingestor, self.gateway, self.required_models, self._triton_state
            )
            if self.settings.storage.warm_snapshots:
                threading.Thread(target=pipeline.warm_up, name="warm-up-collections", daemon=True).start()
            self.address = await self._start_server(service)
            progress(f"orchestrator listening on {self.address}{' (TLS)' if self.settings.server.tls_cert_file else ''}")
            if self.settings.http.enabled:
                app = Starlette(routes=[
                    *openai_routes(self.gateway, knowledge.names, self.triton.endpoints.metrics if self.triton else ""),
                    *rest_routes(self.gateway, service, self.settings.http.console),
                ])
                self.http = HttpServer(self.settings.http, self.settings.server, app)
                self.http_address = await self.http.start()
                console = f", the console on {self.http_address}/console/" if self.settings.http.console else ""
                progress(f"HTTP (OpenAI-compatible /v1, the JSON API /api/v1, /metrics) on {self.http_address}{console}")
            return self.address
        except BaseException:
            await self.stop()
            raise

    def _triton_state(self) -> "pb.TritonState":
        """Triton as Stats reports it: where, and what supervision has had to do."""
        state = pb.TritonState(url=self.triton_url, supervised=self.triton is not None)
        if self.supervisor is not None:
            status = self.supervisor.status()
            state.restarts, state.model_reloads, state.last_failure = status.restarts, status.model_reloads, status.last_failure
        return state

    async def _start_server(self, service: ThinkServeService) -> str:
        limits = self.settings.server
        self.server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", limits.max_message_bytes),
                ("grpc.max_send_message_length", limits.max_message_bytes),
                ("grpc.so_reuseport", 0),  # a second server on the same port must fail, not share it
            ]
        )
        add_service(service, self.server)  # api/decoding.py: bytes that are no message are INVALID_ARGUMENT
        self.standard_health = StandardHealth(lambda: _serving(service), limits.health_interval_s)
        self.standard_health.add_to(self.server)
        credentials = server_credentials(limits)
        try:
            if credentials is None:
                port = self.server.add_insecure_port(f"{limits.host}:{limits.port}")
            else:
                port = self.server.add_secure_port(f"{limits.host}:{limits.port}", credentials)
        except RuntimeError:  # grpcio raises instead of returning 0 in recent versions
            port = 0
        if port == 0:
            raise ConfigurationError(f"cannot listen on {limits.host}:{limits.port} (server.port): address in use or not local")
        await self.server.start()
        await self.standard_health.start()
        return f"{limits.host}:{port}"

    async def stop(self) -> None:
        """Stop supervising (no restart of a Triton being stopped), drain in-flight requests
        (server.shutdown_grace_s), close Triton client streams, then stop Triton."""
        if self.supervisor is not None:
            await self.supervisor.stop()
            self.supervisor = None
        if self.gateway is not None:
            self.gateway.draining = True  # Health says so; new calls get UNAVAILABLE while running ones finish
        if self.standard_health is not None:
            await self.standard_health.stop()  # probes see NOT_SERVING before the drain, and stop sending
            self.standard_health = None
        if self.http is not None:
            await self.http.stop(self.settings.server.shutdown_grace_s)
            self.http = None
        if self.server is not None:
            await self.server.stop(self.settings.server.shutdown_grace_s)
            self.server = None
        if self.gateway is not None:
            self.gateway.pipeline.close()
        if self.tracing is not None:
            self.tracing.shutdown()
            self.tracing = None
        if self.triton_client is not None:
            await self.triton_client.close()
            self.triton_client = None
        if self.triton is not None:
            await asyncio.to_thread(self.triton.stop)
            self.triton = None
        if self.knowledge is not None:
            self.knowledge.close()  # a writer's lock goes last: nothing of this process writes any more
            self.knowledge = None


async def _serving(service: ThinkServeService) -> bool:
    return (await service.health()).serving


@contextlib.asynccontextmanager
async def running(
    settings: Settings, progress: Callable[[str], None] = log.info, contracts: Optional[tuple[ModelContract, ...]] = None
) -> AsyncIterator[Deployment]:
    """A started deployment (Triton + orchestrator in this process; `.address`, `.triton_url`), stopped on leaving
    the block however it ends, a failed start included: the one way the benchmarks and tools start one."""
    deployment = Deployment(settings) if contracts is None else Deployment(settings, contracts)
    try:
        await deployment.start(progress=progress)
        yield deployment
    finally:
        await deployment.stop()
