"""OpenTelemetry traces (``pip install "nanobot[otel]"``): a span for each turn, with child
spans for its model calls, tool calls and sandbox runs, exported over OTLP to the standard
``OTEL_EXPORTER_OTLP_*`` settings (endpoint, headers, ...).

They are on when an OTLP endpoint is set (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) and the extra is installed; otherwise ``span`` is a
no-op and nothing of OpenTelemetry is imported. Log lines then carry the trace id.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
from typing import Any, ContextManager

from nanobot import logs

log = logging.getLogger(__name__)

ENDPOINT_SETTINGS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
_tracer: Any = None
_provider: Any = None


def setup(exporter: Any = None) -> bool:
    """Turn traces on: with ``exporter`` (tests: an in-memory one, spans sent at once), or OTLP
    over HTTP when an endpoint is set and the extra is installed. Whether they are on."""
    global _tracer, _provider
    if exporter is None:
        if not any(os.environ.get(name) for name in ENDPOINT_SETTINGS):
            return False
        if importlib.util.find_spec("opentelemetry.sdk") is None:
            log.warning("an OTLP endpoint is set, but traces need the extra: pip install \"nanobot[otel]\"")
            return False
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    _provider = TracerProvider(resource=Resource.create({"service.name": "nanobot"}))
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        _provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    else:
        _provider.add_span_processor(SimpleSpanProcessor(exporter))
    _tracer = _provider.get_tracer("nanobot")
    logs.trace_ids_from(_trace_id)
    return True


def span(name: str, **attributes: Any) -> ContextManager[Any]:
    """A span around a piece of work (a no-op while traces are off)."""
    if _tracer is None:
        return contextlib.nullcontext()
    return _tracer.start_as_current_span(name, attributes={k: v for k, v in attributes.items() if v is not None})


def shutdown() -> None:
    """Send what is buffered (at exit), and stop."""
    global _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    _tracer = _provider = None
    logs.trace_ids_from(None)


def _trace_id() -> str | None:
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None
