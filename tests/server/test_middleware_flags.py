"""vLLM's --middleware (the user's ASGI middleware, a class or an async function, by import
path) and --h11-max-header-count (a request with more headers is a 431)."""

from __future__ import annotations

import textwrap

import httpx
import pytest
from server_support import in_process_server

from tokenmill.engine.cli import main

MIDDLEWARE = textwrap.dedent('''
    class Stamp:
        def __init__(self, app):
            self.app = app

        async def __call__(self, scope, receive, send):
            async def stamped(message):
                if message["type"] == "http.response.start":
                    message["headers"] = [*message["headers"], (b"x-class", b"seen")]
                await send(message)
            await self.app(scope, receive, stamped if scope["type"] == "http" else send)


    async def stamp(request, call_next):
        response = await call_next(request)
        response.headers["x-function"] = request.url.path
        return response
''')


@pytest.fixture(scope="module")
def server(tiny_llama_dir, tmp_path_factory):
    directory = tmp_path_factory.mktemp("middleware")
    (directory / "tm_test_middleware.py").write_text(MIDDLEWARE)
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(directory))
        with in_process_server(
                tiny_llama_dir, "tiny", kv_cache_memory=16 << 20, max_model_len=512,
                options={"middleware": ("tm_test_middleware.Stamp",
                                        "tm_test_middleware:stamp"),
                         "max_header_count": 40, "api_key": "k"}) as server:
            yield server


def test_the_users_middleware_sees_every_request_and_answer(server):
    for path in ("/health", "/v1/models"):
        reply = httpx.get(server.url + path, headers={"Authorization": "Bearer k"}, timeout=30)
        assert reply.status_code == 200
        assert reply.headers["x-class"] == "seen" and reply.headers["x-function"] == path
    # Outside the key check, as vLLM adds them: a 401 passes through them too.
    refused = httpx.get(server.url + "/v1/models", timeout=30)
    assert refused.status_code == 401 and refused.headers["x-class"] == "seen"


def test_more_headers_than_the_limit_is_a_431(server):
    many = {f"x-extra-{i}": "1" for i in range(60)}
    refused = httpx.get(server.url + "/health", headers=many, timeout=30)
    assert refused.status_code == 431
    assert "more than this server's limit of 40 (--h11-max-header-count)" in \
        refused.json()["error"]["message"]
    few = {f"x-extra-{i}": "1" for i in range(20)}
    assert httpx.get(server.url + "/health", headers=few, timeout=30).status_code == 200


@pytest.mark.parametrize("path, error", [
    ("no_such_module_here.Thing", "--middleware: can't import no_such_module_here.Thing"),
    ("json.dumps", "--middleware: json.dumps is neither a class nor an async function"),
])
def test_middleware_that_cannot_be_added_exits_2(path, error, capsys):
    code = main(["serve", "--model", "/nonexistent", "--middleware", path])
    assert code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"tokenmill serve: error: {error}"), last
