"""OpenTelemetry spans: one per request, one per query stage under it (the RAG blueprint's layout).

Off by default: the tracer is then OpenTelemetry's no-op one and a span costs a function call. Each deployment
has its own tracer provider (never the process-global one), so embedding ThinkServe does not take over the
host application's tracing, and tests can hand in an in-memory exporter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from opentelemetry import trace

from ..config import ObservabilitySettings
from ..errors import ConfigurationError


@dataclass
class Tracing:
    tracer: trace.Tracer
    provider: Optional[object] = None  # the SDK provider to flush and shut down, when tracing is on

    def shutdown(self) -> None:
        if self.provider is not None:
            self.provider.shutdown()
            self.provider = None


def setup_tracing(settings: ObservabilitySettings, exporter=None) -> Tracing:
    """The deployment's tracer: `exporter` if given (a SpanExporter), else the one settings name, else no-op."""
    if exporter is None and settings.tracing == "off":
        return Tracing(trace.NoOpTracer())
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": settings.service_name}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    elif settings.tracing == "console":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    else:
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise ConfigurationError(
                "observability.tracing = 'otlp' needs the OTLP exporter: pip install 'thinkserve[otlp]'"
            ) from None
        otlp = OTLPSpanExporter(endpoint=settings.otlp_endpoint) if settings.otlp_endpoint else OTLPSpanExporter()
        provider.add_span_processor(BatchSpanProcessor(otlp))
    return Tracing(provider.get_tracer("thinkserve"), provider)
