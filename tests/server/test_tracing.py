"""--otlp-traces-endpoint: a span per finished request reaches a real OTLP receiver (the
OpenTelemetry collector's gRPC service, and its HTTP endpoint), named and attributed as vLLM's,
in the caller's trace when the request carried W3C trace context."""

from __future__ import annotations

import contextlib
import http.server
import queue
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2
from server_support import ServeProcess, in_process_server, openai_client, wait_idle

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
# Spans leave in batches: a short delay keeps the test from waiting the SDK's default 5 s.
QUICK_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "100"}


class _Received:
    """Each exported span with its resource's attributes."""

    def __init__(self) -> None:
        self.spans: queue.Queue = queue.Queue()

    def add(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.put((resource, span))

    def take(self, count: int, timeout: float = 30) -> list[tuple[dict, trace_pb2.Span]]:
        return [self.spans.get(timeout=timeout) for _ in range(count)]


@contextlib.contextmanager
def grpc_receiver() -> Iterator[tuple[str, _Received]]:
    """The collector's OTLP gRPC trace service on a loopback port: its URL."""
    received = _Received()

    class Service(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):  # noqa: N802 (the service's method name)
            received.add(request)
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(ThreadPoolExecutor(2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"http://127.0.0.1:{port}", received
    finally:
        server.stop(0)


@contextlib.contextmanager
def http_receiver() -> Iterator[tuple[str, _Received]]:
    """The collector's OTLP/HTTP endpoint (protobuf bodies) on a loopback port: its URL."""
    received = _Received()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (the handler's method name)
            body = self.rfile.read(int(self.headers["Content-Length"]))
            assert self.path == "/v1/traces"
            received.add(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
            reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces", received
    finally:
        server.shutdown()
        server.server_close()


def _attributes(pairs) -> dict:
    def value(v):
        kind = v.WhichOneof("value")
        if kind == "array_value":
            return [value(x) for x in v.array_value.values]
        return getattr(v, kind)
    return {kv.key: value(kv.value) for kv in pairs}


def _check_times(span: trace_pb2.Span, attributes: dict, sent: float, answered: float) -> None:
    """The span runs from the request's arrival to its end, and its latencies nest."""
    start, end = span.start_time_unix_nano / 1e9, span.end_time_unix_nano / 1e9
    assert sent - 0.05 <= start <= end <= answered + 0.05
    assert end - start == pytest.approx(attributes["gen_ai.latency.e2e"], abs=1e-3)
    queued = attributes["gen_ai.latency.time_in_queue"]
    assert 0 <= queued <= attributes["gen_ai.latency.time_to_first_token"] <= \
        attributes["gen_ai.latency.e2e"]
    assert attributes["gen_ai.latency.time_in_model_prefill"] + \
        attributes["gen_ai.latency.time_in_model_decode"] == pytest.approx(
            attributes["gen_ai.latency.time_in_model_inference"], abs=1e-6)


def test_spans_reach_a_grpc_collector_in_the_callers_trace(tiny_llama_dir):
    with grpc_receiver() as (endpoint, received):
        server = ServeProcess(tiny_llama_dir, "--served-model-name", "tiny",
                              "--max-model-len", "256", "--otlp-traces-endpoint", endpoint,
                              env=QUICK_EXPORT)
        try:
            server.wait_healthy(120)
            client = openai_client(f"{server.url}/v1")
            sent = time.time()
            completion = client.completions.create(
                model="tiny", prompt="Once upon a time", max_tokens=5, temperature=0.7,
                top_p=0.9, seed=1, extra_headers={"traceparent": TRACEPARENT})
            answered = time.time()
            (resource, span), = received.take(1)
            chunks = list(client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "Hi"}], n=2, max_tokens=4,
                stream=True, stream_options={"include_usage": True}))
            (_, chat_span), = received.take(1)
        finally:
            server.kill()
            server.wait()

    assert resource["service.name"] == "tokenmill"
    assert span.name == "llm_request" and span.kind == trace_pb2.Span.SPAN_KIND_SERVER
    assert span.trace_id.hex() == TRACE_ID and span.parent_span_id.hex() == PARENT_ID
    attributes = _attributes(span.attributes)
    assert attributes["gen_ai.request.id"] == f"{completion.id}-0"
    assert {k: attributes[k] for k in (
        "gen_ai.response.model", "gen_ai.request.n", "gen_ai.request.temperature",
        "gen_ai.request.top_p", "gen_ai.request.max_tokens", "gen_ai.usage.prompt_tokens",
        "gen_ai.usage.completion_tokens", "gen_ai.usage.num_sequences",
        "gen_ai.response.finish_reasons")} == {
        "gen_ai.response.model": "tiny", "gen_ai.request.n": 1,
        "gen_ai.request.temperature": pytest.approx(0.7), "gen_ai.request.top_p":
        pytest.approx(0.9), "gen_ai.request.max_tokens": 5,
        "gen_ai.usage.prompt_tokens": completion.usage.prompt_tokens,
        "gen_ai.usage.completion_tokens": completion.usage.completion_tokens,
        "gen_ai.usage.num_sequences": 1, "gen_ai.response.finish_reasons": ["length"]}
    _check_times(span, attributes, sent, answered)

    # Without trace context: a trace of its own; a streamed chat of two choices is one span.
    assert chat_span.trace_id.hex() != TRACE_ID and chat_span.parent_span_id == b""
    chat = _attributes(chat_span.attributes)
    usage = chunks[-1].usage
    assert chat["gen_ai.request.id"].startswith("chatcmpl-")
    assert (chat["gen_ai.request.n"], chat["gen_ai.usage.num_sequences"]) == (2, 2)
    assert chat["gen_ai.usage.prompt_tokens"] == usage.prompt_tokens
    assert chat["gen_ai.usage.completion_tokens"] == usage.completion_tokens == 8


def test_spans_reach_an_http_collector_with_the_callers_trace_state(tiny_llama_dir,
                                                                    monkeypatch):
    """OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf, and the service named by
    OTEL_SERVICE_NAME, as the SDK reads them; a client that goes away gets no span."""
    for name, value in {**QUICK_EXPORT, "OTEL_SERVICE_NAME": "llm-gateway",
                        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}.items():
        monkeypatch.setenv(name, value)
    with http_receiver() as (endpoint, received), \
            in_process_server(tiny_llama_dir, "tiny", max_model_len=256,
                              options={"otlp_traces_endpoint": endpoint}) as server:
        try:
            with httpx.stream("POST", f"{server.url}/v1/completions", timeout=60, json={
                    "model": "tiny", "prompt": "Hello", "max_tokens": 200, "ignore_eos": True,
                    "stream": True}) as left:
                next(left.iter_lines())  # the client leaves after the first chunk
            wait_idle(server.state)
            reply = httpx.post(f"{server.url}/v1/completions", timeout=60, headers={
                "traceparent": TRACEPARENT, "tracestate": "vendor=abc"}, json={
                "model": "tiny", "prompt": "Hello", "max_tokens": 3}).json()
            (resource, span), = received.take(1)
        finally:
            server.state.tracer.shutdown()
    assert resource["service.name"] == "llm-gateway"
    assert span.trace_id.hex() == TRACE_ID and span.parent_span_id.hex() == PARENT_ID
    assert span.trace_state == "vendor=abc"
    attributes = _attributes(span.attributes)
    assert attributes["gen_ai.request.id"] == f"{reply['id']}-0"
    assert attributes["gen_ai.usage.completion_tokens"] == reply["usage"]["completion_tokens"]
    assert received.spans.empty()  # nothing for the request whose client left
    assert not server.state.tracer._begun


@pytest.mark.parametrize(("flags", "env", "reason"), [
    (["--collect-detailed-traces", "all"], {}, "--collect-detailed-traces: needs "
                                               "--otlp-traces-endpoint"),
    (["--otlp-traces-endpoint", "http://127.0.0.1:9"],
     {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"},
     "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL='http/json' is not one of grpc, http/protobuf"),
])
def test_tracing_that_cannot_work_exits_2_naming_it(tiny_llama_dir, flags, env, reason):
    code, stderr = ServeProcess(tiny_llama_dir, *flags, env=env).finish()
    assert code == 2 and reason in stderr, stderr
