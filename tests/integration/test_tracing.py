"""Traces as an operator collects them: `observability.tracing = "otlp"` exports the request and stage spans
over OTLP/gRPC to a collector (here a real gRPC server implementing the OTLP trace service), and a caller's
W3C `traceparent`, over gRPC (the Python client sends its current span's) or over HTTP, continues its trace."""

from __future__ import annotations

import threading
from concurrent import futures

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.trace import TracerProvider

from orchestrator.client import ThinkServeClient
from orchestrator.server.deployment import Deployment
from tests.conftest import SAMPLE_DOCUMENT, settings_with
from tests.integration.conftest import BackgroundLoop

pytestmark = pytest.mark.integration

QUESTION = "What was Northwind's total revenue in 2024?"
HTTP_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
HTTP_PARENT = "00f067aa0ba902b7"


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """What an OpenTelemetry collector receives: (service name, span) of every exported span."""

    def __init__(self):
        self.spans = []
        self._lock = threading.Lock()

    def Export(self, request, context):
        with self._lock:
            for resource in request.resource_spans:
                attributes = {a.key: a.value.string_value for a in resource.resource.attributes}
                for scope in resource.scope_spans:
                    self.spans += [(attributes.get("service.name"), span) for span in scope.spans]
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture
def collector():
    received = Collector()
    server = grpc.server(futures.ThreadPoolExecutor(2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(received, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield received, port
    server.stop(None)


def test_spans_reach_an_otlp_collector_and_continue_the_callers_trace(collector, triton, triton_settings, tmp_path):
    received, port = collector
    settings = settings_with(
        triton_settings.model_copy(update={"url": triton.endpoints.grpc}), tmp_path / "data",
        observability={"tracing": "otlp", "otlp_endpoint": f"http://127.0.0.1:{port}", "service_name": "thinkserve-otlp-test"},
    )
    loop = BackgroundLoop()
    deployment = Deployment(settings)
    try:
        address = loop.run(deployment.start(progress=lambda _: None))
        caller = TracerProvider().get_tracer("caller")
        with ThinkServeClient(address) as client:
            client.ingest_file("otlp", SAMPLE_DOCUMENT)
            with caller.start_as_current_span("caller.ask") as asking:
                list(client.query("otlp", QUESTION, request_id="otlp-grpc"))
        body = {"model": "otlp", "messages": [{"role": "user", "content": QUESTION}]}
        response = httpx.post(f"{deployment.http_address}/v1/chat/completions", json=body, timeout=120,
                              headers={"traceparent": f"00-{HTTP_TRACE}-{HTTP_PARENT}-01", "x-request-id": "otlp-http"})
        assert response.status_code == 200
    finally:
        loop.run(deployment.stop())  # flushes the batch exporter
        loop.close()

    spans = [span for service, span in received.spans if service == "thinkserve-otlp-test"]
    assert spans, f"the collector received nothing ({len(received.spans)} spans of other services)"

    def request_span(name: str, request_id: str):
        return next(s for s in spans if s.name == name and any(
            a.key == "thinkserve.request_id" and a.value.string_value == request_id for a in s.attributes))

    over_grpc = request_span("thinkserve.Query", "otlp-grpc")
    context = asking.get_span_context()
    assert over_grpc.trace_id == context.trace_id.to_bytes(16, "big")  # the caller's trace, continued
    assert over_grpc.parent_span_id == context.span_id.to_bytes(8, "big")
    stages = {s.name for s in spans if s.parent_span_id == over_grpc.span_id}
    assert {"stage.route", "stage.embed", "stage.retrieval", "stage.answer"} <= stages

    over_http = request_span("thinkserve.ChatCompletions", "otlp-http")
    assert over_http.trace_id.hex() == HTTP_TRACE and over_http.parent_span_id.hex() == HTTP_PARENT
    ingest = next(s for s in spans if s.name == "thinkserve.Ingest")
    assert ingest.parent_span_id == b""  # no caller span: a trace of its own
