"""The tail a streaming parser holds back: only what may still grow into a marker."""

from tokenmill.engine.server.partial_markers import partial_marker_length


def test_the_longest_tail_that_begins_any_marker_is_held():
    assert partial_marker_length("hello <too", ["<tool_call>"]) == 4
    assert partial_marker_length("hello <", ["<tool_call>", "</think>"]) == 1
    assert partial_marker_length("a </thi", ["<tool_call>", "</think>"]) == 5
    assert partial_marker_length("x<|ch", ["<|channel|>", "<|message|>"]) == 4


def test_text_that_cannot_become_a_marker_is_not_held():
    assert partial_marker_length("hello", ["<tool_call>"]) == 0
    assert partial_marker_length("", ["<tool_call>"]) == 0
    assert partial_marker_length("a < b", ["<tool_call>"]) == 0
    assert partial_marker_length("anything", []) == 0


def test_a_whole_marker_is_never_held_as_a_partial_one():
    # A complete marker is the parser's to find; only a strict prefix is held.
    assert partial_marker_length("<tool_call>", ["<tool_call>"]) == 0
    assert partial_marker_length("xab", ["abc"]) == 2
