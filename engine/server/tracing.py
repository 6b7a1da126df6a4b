"""--otlp-traces-endpoint: a span per finished generation request sent to an OpenTelemetry
collector, as vLLM sends them (its `llm_request` span, its gen_ai.* attribute names), so a
vLLM trace pipeline (Jaeger, Tempo, an OTel collector) reads a tokenmill server unchanged.

Only counts and times go out, never a prompt or a reply. A request whose HTTP headers carry
W3C trace context (`traceparent`, `tracestate`) gets a span in the caller's trace, a child of
the caller's span; one without starts a trace of its own. Spans leave in batches on the
SDK's own thread (BatchSpanProcessor), so neither the event loop nor the engine waits on the
collector; what is still queued is sent when the server stops.
"""

from __future__ import annotations

import contextvars
import os
import time
from typing import Any

from tokenmill.engine.core import RequestOutput, SamplingParams

SPAN_NAME = "llm_request"
# The exporter's wire protocol, as the OpenTelemetry SDKs (and vLLM) read it: gRPC unless set.
PROTOCOL_VARIABLE = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
PROTOCOLS = ("grpc", "http/protobuf")
TRACE_HEADERS = (b"traceparent", b"tracestate")

# The trace context of the HTTP request being served (set by TraceContextMiddleware).
_incoming: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "incoming_trace_headers", default=None)


def check_protocol() -> str:
    """The exporter's protocol from the environment; ValueError naming the variable for one
    no OTLP exporter here speaks."""
    protocol = os.environ.get(PROTOCOL_VARIABLE, "grpc") or "grpc"
    if protocol not in PROTOCOLS:
        raise ValueError(f"{PROTOCOL_VARIABLE}={protocol!r} is not one of "
                         f"{', '.join(PROTOCOLS)}")
    return protocol


class TraceContextMiddleware:
    """Keeps the trace headers of each HTTP request in a context variable for as long as the
    request is served, where RequestTracer.begin reads them."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {name.decode("latin-1"): value.decode("latin-1")
                   for name, value in scope["headers"] if name in TRACE_HEADERS}
        token = _incoming.set(headers or None)
        try:
            await self.app(scope, receive, send)
        finally:
            _incoming.reset(token)


class RequestTracer:
    """The spans of one server: begun when a request is admitted (what it asked for, its
    caller's trace), ended and sent when its final output is seen."""

    def __init__(self, endpoint: str):
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace import SpanKind
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        named = os.environ.get("OTEL_SERVICE_NAME") or \
            "service.name=" in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
        resource = Resource.create({} if named else {"service.name": "tokenmill"})
        self._provider = TracerProvider(resource=resource)
        self._provider.add_span_processor(BatchSpanProcessor(_exporter(endpoint)))
        self._tracer = self._provider.get_tracer("tokenmill")
        self._propagator = TraceContextTextMapPropagator()
        self._server = SpanKind.SERVER
        self._begun: dict[str, tuple[Any, dict[str, Any]]] = {}

    def begin(self, request_id: str, model: str, params: SamplingParams) -> None:
        """Remember an admitted request's caller's trace and what it asked for."""
        headers = _incoming.get()
        context = self._propagator.extract(headers) if headers else None
        asked = {"gen_ai.request.id": request_id, "gen_ai.response.model": model,
                 "gen_ai.request.n": params.n, "gen_ai.request.temperature": params.temperature,
                 "gen_ai.request.top_p": params.top_p}
        if params.max_tokens is not None:
            asked["gen_ai.request.max_tokens"] = params.max_tokens
        self._begun[request_id] = (context, asked)

    def end(self, out: RequestOutput) -> None:
        """Send the span of a request begun here, from its final output."""
        begun = self._begun.pop(out.request_id, None)
        if begun is None:
            return
        context, attributes = begun
        timings = out.timings
        attributes = {**attributes, **_usage(out), **_latencies(timings)}
        # Spans carry nanoseconds since the epoch; the timings are time.monotonic() instants.
        offset = time.time_ns() - int(time.monotonic() * 1e9)
        span = self._tracer.start_span(SPAN_NAME, context=context, kind=self._server,
                                       attributes=attributes,
                                       start_time=offset + int(timings.arrival * 1e9))
        span.end(end_time=offset + int((timings.finished or time.monotonic()) * 1e9))

    def forget(self, request_id: str) -> None:
        """A request that ends without a final output (its client went away): no span."""
        self._begun.pop(request_id, None)

    def shutdown(self) -> None:
        """Send what is queued, then stop the exporter's thread."""
        self._provider.shutdown()


def _exporter(endpoint: str) -> Any:
    if check_protocol() == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    return OTLPSpanExporter(endpoint=endpoint)


def _usage(out: RequestOutput) -> dict[str, Any]:
    reasons = [c.finish_reason for c in out.outputs if c.finish_reason is not None]
    return {"gen_ai.usage.prompt_tokens": out.num_prompt_tokens,
            "gen_ai.usage.completion_tokens": sum(len(c.token_ids) for c in out.outputs),
            "gen_ai.usage.num_sequences": len(out.outputs),
            **({"gen_ai.response.finish_reasons": reasons} if reasons else {})}


def _latencies(timings: Any) -> dict[str, float]:
    """vLLM's latency attributes, in seconds, of those the request lived to have."""
    spans = {"gen_ai.latency.time_in_queue": timings.queue_time,
             "gen_ai.latency.time_to_first_token": timings.time_to_first_token,
             "gen_ai.latency.e2e": timings.e2e_latency,
             "gen_ai.latency.time_in_model_prefill": timings.prefill_time,
             "gen_ai.latency.time_in_model_decode": timings.decode_time,
             "gen_ai.latency.time_in_model_inference": timings.inference_time}
    return {name: seconds for name, seconds in spans.items() if seconds is not None}

