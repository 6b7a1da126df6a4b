"""Schemathesis against the server's own OpenAPI document, on loopback: valid and invalid
bodies for every operation. No answer may be a 5xx (a 503 would only come from overload or
draining, neither of which happens here), and the server serves a normal request afterwards.

CI runs a bounded number of examples per operation on the tiny random model with a 128-token
context, so every generated request is quick. For a longer run, see "Fuzzing" in the README.
"""

from __future__ import annotations

import os

import httpx
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from server_support import server_state

from tokenmill.engine.server.app import create_app

EXAMPLES = int(os.environ.get("TOKENMILL_FUZZ_EXAMPLES", "25"))


def _document() -> dict:
    """The document a server serves at /openapi.json (the routes and request models; which
    model it serves doesn't change it). Test items are made from it at collection, before any
    server runs; the first test checks that the live server serves the same one."""
    return create_app(server_state("tiny", load=False), load_model=False).openapi()


DOCUMENT = _document()
schema = schemathesis.openapi.from_dict(DOCUMENT)


def test_the_live_server_serves_this_document(tiny_server):
    url = tiny_server.url
    assert httpx.get(f"{url}/openapi.json").json() == DOCUMENT


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck),
          derandomize=True, database=None)
def test_no_request_gets_a_server_error(case, tiny_server):
    url, state = tiny_server.url, tiny_server.state
    if isinstance(case.body, dict) and isinstance(case.body.get("model"), str):
        # A random model name is a 404 before anything else is looked at; the served name
        # takes the rest of the body through to the engine.
        case.body["model"] = state.options.served_model_name
    # The timeout catches a hang; a request of many choices takes a while on a loaded machine.
    case.call_and_validate(base_url=url, checks=[not_a_server_error], timeout=180)


def test_the_server_still_serves_afterwards(tiny_server):
    r = tiny_server.client.completions.create(model="tiny", prompt="Hi", max_tokens=3,
                                              temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3
    assert tiny_server.state.ready
