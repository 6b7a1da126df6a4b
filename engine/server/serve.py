"""`tokenmill serve`: uvicorn with a draining shutdown that Kubernetes can rely on.

On SIGTERM (or SIGINT) the server keeps its socket open but turns /health to 503 and answers
new requests with 503, lets running requests finish for up to --shutdown-timeout seconds,
aborts what is left, then stops and exits 0. A second signal stops at once.

A server that can never serve exits 1 with the reason on stderr: a model that fails to load,
an engine loop that dies. Kubernetes then restarts it and shows why, where a live process
answering 503 forever would hide the cause. A port that can't be bound exits 3 (uvicorn's
start-up failure); an invalid option value exits 2 before the server starts (see cli.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import ssl

import jinja2
import uvicorn

from tokenmill.engine.contract.server_flags import check_server_flags
from tokenmill.engine.core import generation_config
from tokenmill.engine.core.errors import ConfigError
from tokenmill.engine.log import apply_log_config
from tokenmill.engine.server.app import create_app
from tokenmill.engine.server.metrics import EngineMetrics
from tokenmill.engine.server.request_log import enable_request_log
from tokenmill.engine.server.state import ServerOptions, ServerState
from tokenmill.engine.server.tls_refresh import CertificateWatch
from tokenmill.engine.server.tracing import check_protocol

log = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: ServerState,
                 refresh_tls: bool = False):
        super().__init__(config)
        self.tokenmill = state
        self._drain_task: asyncio.Task | None = None
        self.failure: BaseException | None = None
        self.refresh_tls = refresh_tls  # --enable-ssl-refresh
        self._certificates: CertificateWatch | None = None

    async def on_tick(self, counter: int) -> bool:
        """uvicorn's 0.1 s tick; also stops the server once it can never serve, and with
        --enable-ssl-refresh looks at the TLS files once a second."""
        if self.refresh_tls and self.config.ssl is not None and counter % 10 == 0:
            if self._certificates is None:
                self._certificates = CertificateWatch(self.config.ssl, self.config.ssl_keyfile,
                                                      self.config.ssl_certfile,
                                                      self.config.ssl_ca_certs)
            self._certificates.check()
        fatal = self.tokenmill.fatal_error() if self.failure is None else None
        if fatal is not None:
            what, self.failure = fatal
            reason = " ".join(f"{type(self.failure).__name__}: {self.failure}".split())
            log.error(f"{what}; exiting", extra={"error": reason})
            self.should_exit = True
        return await super().on_tick(counter)

    def handle_exit(self, sig: int, frame) -> None:  # called from the signal handler
        if self._drain_task is not None:
            super().handle_exit(sig, frame)  # a second signal: stop now
            return
        loop = asyncio.get_event_loop()
        self._drain_task = loop.create_task(self._drain())

    async def _drain(self) -> None:
        state = self.tokenmill
        state.draining = True
        timeout = state.options.shutdown_timeout
        log.warning("draining", extra={"in_flight": state.in_flight, "timeout_s": timeout})
        try:
            await asyncio.wait_for(state.idle.wait(), timeout)
        except TimeoutError:
            log.warning("shutdown timeout: aborting running requests",
                        extra={"in_flight": state.in_flight})
            if state.engine is not None:
                state.engine.abort_all()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(state.idle.wait(), 5.0)
        self.should_exit = True


def read_chat_template(value: str | None) -> str | None:
    """--chat-template's text: the file it names, or the value itself when it is a Jinja
    template; ConfigError (exit 2) for neither, or for a template that does not parse.
    Read here, not when flags are parsed: the operator checks a pod's flags where the pod's
    files are not."""
    if value is None:
        return None
    if os.path.isfile(value):
        try:
            with open(value, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError("--chat-template", f"can't read {value}: {exc}") from None
    elif "{{" in value or "{%" in value:
        text = value
    else:
        raise ConfigError("--chat-template", f"{value!r} is neither a file nor a Jinja "
                                             "template")
    try:
        jinja2.Environment().parse(text)
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError("--chat-template", f"the template does not parse: line {exc.lineno}: "
                                             f"{exc.message}") from None
    return text


def check_tls_files(args: argparse.Namespace) -> None:
    """ConfigError (exit 2) naming the flag when the key, certificate, CA file or cipher list
    can't be used; uvicorn would only fail with a traceback once the model had loaded."""
    if args.ssl_keyfile is None:
        return
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(args.ssl_certfile, args.ssl_keyfile)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError("--ssl-certfile", f"can't load {args.ssl_certfile} with the key "
                                            f"{args.ssl_keyfile}: {exc}") from None
    if args.ssl_ca_certs is not None:
        try:
            context.load_verify_locations(args.ssl_ca_certs)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError("--ssl-ca-certs", f"can't load {args.ssl_ca_certs}: {exc}") from None
    if args.ssl_ciphers is not None:
        try:
            context.set_ciphers(args.ssl_ciphers)
        except ssl.SSLError:
            raise ConfigError("--ssl-ciphers", f"{args.ssl_ciphers!r} selects no cipher "
                                               "OpenSSL knows") from None


def server_state(config, args: argparse.Namespace) -> ServerState:
    """The server's state from `tokenmill serve`'s flags (`tokenmill run-batch` takes them
    too), once check_server_flags has passed them; the model is not loaded yet. Logging is
    configured here: --log-config-file, then the request-log flags over it."""
    if args.log_config_file is not None:
        try:
            apply_log_config(args.log_config_file)
        except ValueError as exc:
            raise ConfigError("--log-config-file", str(exc)) from None
    if args.enable_log_requests or args.enable_log_outputs:
        enable_request_log()
    name, *aliases = args.served_model_name or [config.model]
    return ServerState(
        options=ServerOptions(served_model_name=name, model_aliases=tuple(aliases),
                              freeze_startup_heap=True,
                              max_waiting_requests=args.max_waiting_requests,
                              max_stored_responses=args.max_stored_responses,
                              shutdown_timeout=args.shutdown_timeout,
                              api_key=args.api_key,
                              max_request_body_bytes=args.max_request_body_bytes,
                              enable_auto_tool_choice=args.enable_auto_tool_choice,
                              tool_call_parser=args.tool_call_parser,
                              chat_template=read_chat_template(args.chat_template),
                              chat_template_content_format=(
                                  args.chat_template_content_format),
                              default_chat_template_kwargs=args.default_chat_template_kwargs,
                              trust_request_chat_template=args.trust_request_chat_template,
                              response_role=args.response_role,
                              reasoning_parser=args.reasoning_parser,
                              generation_config=generation_config.checked_source(
                                  args.generation_config, "--generation-config"),
                              generation_overrides=args.override_generation_config,
                              allowed_origins=tuple(args.allowed_origins),
                              allowed_methods=tuple(args.allowed_methods),
                              allowed_headers=tuple(args.allowed_headers),
                              allow_credentials=args.allow_credentials,
                              fastapi_docs=not args.disable_fastapi_docs,
                              max_header_count=args.h11_max_header_count,
                              middleware=tuple(args.middleware),
                              tokenizer_info_endpoint=args.enable_tokenizer_info_endpoint,
                              log_requests=args.enable_log_requests,
                              log_outputs=args.enable_log_outputs,
                              log_deltas=args.enable_log_deltas,
                              log_error_stack=args.log_error_stack,
                              otlp_traces_endpoint=args.otlp_traces_endpoint,
                              max_log_len=args.max_log_len,
                              return_tokens_as_token_ids=args.return_tokens_as_token_ids,
                              force_include_usage=args.enable_force_include_usage,
                              root_path=args.root_path,
                              allowed_local_media_path=args.allowed_local_media_path,
                              allowed_media_domains=(
                                  tuple(args.allowed_media_domains)
                                  if args.allowed_media_domains else None)),
        config=config, metrics=EngineMetrics(name, vllm_names=args.vllm_metrics),
    )


def check_tracing(args: argparse.Namespace) -> None:
    """ConfigError (exit 2) naming the flag where spans could not be exported: the exporter's
    protocol variable names one there is no exporter for."""
    if args.otlp_traces_endpoint is None:
        return
    try:
        check_protocol()
    except ValueError as exc:
        raise ConfigError("--otlp-traces-endpoint", str(exc)) from None


def check_media_path(args: argparse.Namespace) -> None:
    """ConfigError (exit 2) where --allowed-local-media-path names no directory here (checked
    where the server runs, not by the operator, which sees another file system)."""
    path = args.allowed_local_media_path
    if path is not None and not os.path.isdir(path):
        raise ConfigError("--allowed-local-media-path", f"{path} is not a directory")


def uvicorn_log_level(args: argparse.Namespace) -> str | None:
    """--uvicorn-log-level; left out, warning, or the --log-config-file's levels (None)."""
    if args.uvicorn_log_level is None and args.log_config_file is None:
        return "warning"
    return args.uvicorn_log_level


def serve(config, args: argparse.Namespace) -> int:
    check_server_flags(args)
    check_tls_files(args)
    check_media_path(args)
    check_tracing(args)
    state = server_state(config, args)
    app = create_app(state)
    uv_config = uvicorn.Config(app, host=args.host, port=args.port, uds=args.uds,
                               log_level=uvicorn_log_level(args),
                               # the file configured uvicorn's loggers too: no defaults over it
                               **({"log_config": None} if args.log_config_file else {}),
                               access_log=not args.disable_uvicorn_access_log,
                               h11_max_incomplete_event_size=(
                                   args.h11_max_incomplete_event_size),
                               ssl_keyfile=args.ssl_keyfile, ssl_certfile=args.ssl_certfile,
                               ssl_ca_certs=args.ssl_ca_certs, ssl_cert_reqs=args.ssl_cert_reqs,
                               **({"ssl_ciphers": args.ssl_ciphers} if args.ssl_ciphers else {}),
                               timeout_graceful_shutdown=5)
    server = DrainingServer(uv_config, state, refresh_tls=args.enable_ssl_refresh)
    try:
        server.run()
    finally:
        state.close()
    return 0 if server.failure is None else 1
