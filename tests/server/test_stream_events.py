"""A streamed chunk on the wire: one server-sent event whose data is the chunk's JSON."""

import json

from tokenmill.engine.server.rendering import sse


def test_an_event_carries_the_chunk_as_json_with_text_as_written():
    body = {"id": "cmpl-1", "object": "text_completion", "created": 1795960549,
            "model": "tiny", "choices": [{
                "index": 0, "text": "Grüße, 世界 🚀", "finish_reason": None,
                "logprobs": {"tokens": ["Gr"], "token_logprobs": [-0.6931471805599453],
                             "top_logprobs": [{"Gr": -0.6931471805599453, "G": -1.5e-05}],
                             "text_offset": [0]}}]}
    event = sse(body)
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    assert json.loads(event[len(b"data: "):]) == body
    assert "Grüße, 世界 🚀".encode() in event  # UTF-8 as is, not \u escapes


def test_a_key_that_is_not_a_string_is_written_as_its_text():
    event = sse({"top": {17: -0.25, 3: -1.0}})
    assert json.loads(event[len(b"data: "):]) == {"top": {"17": -0.25, "3": -1.0}}
