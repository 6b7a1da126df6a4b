"""Event messages fit the API server's limit, counted in bytes."""

from __future__ import annotations

import pytest

from tokenmill.operator.events import MESSAGE_BYTES, fit


@pytest.mark.parametrize("message", ["x" * 5000, "模型" * 700, "\U0001F525" * 1000,
                                     "a" + "é" * 1023, "start " + "\U0001F525" * 300 + " end"])
def test_a_long_message_keeps_its_start_and_end_within_the_limit(message):
    fitted = fit(message)
    assert len(fitted.encode()) <= MESSAGE_BYTES
    assert "..." in fitted and "\ufffd" not in fitted
    head, _, tail = fitted.partition("...")
    assert message.startswith(head) and message.endswith(tail)
    assert len(fitted.encode()) > MESSAGE_BYTES - 8  # no more cut than a character's split


def test_a_message_within_the_limit_is_left_as_it_is():
    for message in ("", "pod a: exited 1", "é" * 512, "x" * MESSAGE_BYTES):
        assert fit(message) == message
