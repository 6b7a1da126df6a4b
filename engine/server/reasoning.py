"""Reasoning models' thinking, split from their answer (vLLM's --reasoning-parser).

Every format thinks between a start and an end tag, then answers:
- `qwen3`: the model writes `<think>` itself; a reply that does not start with it (thinking
  turned off by `chat_template_kwargs: {"enable_thinking": false}`) is all answer.
- `deepseek_r1`: the chat template opens `<think>` in the prompt, so the reply starts inside
  the thinking; everything up to `</think>` is reasoning.
- `mistral`: Magistral writes `[THINK]` ... `[/THINK]` itself, as Qwen3 writes its tags.

The answer after the end tag loses its leading blank lines. A reply cut off while thinking is
all reasoning, with no answer. While a reply streams, a tail that may be the start of a tag
is held back until the next text shows what it is, so what is sent never has to be taken
back and the streamed pieces join to the whole reply's split.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ThinkingFormat:
    starts_inside: bool  # the chat template has opened the thinking already
    start: str = "<think>"
    end: str = "</think>"


REASONING_PARSERS = {"deepseek_r1": ThinkingFormat(starts_inside=True),
                     "qwen3": ThinkingFormat(starts_inside=False),
                     "mistral": ThinkingFormat(False, "[THINK]", "[/THINK]")}


def split_reasoning(text: str, thinking: ThinkingFormat,
                    final: bool = True) -> tuple[str | None, str]:
    """(reasoning, answer) of a reply; reasoning None when the reply does not think. With
    final False (a reply still streaming), a possible partial tag at the end is left out."""
    body = text
    if not thinking.starts_inside:
        stripped = text.lstrip()
        if not stripped.startswith(thinking.start):
            if not final and thinking.start.startswith(stripped):
                return None, ""  # blank so far, or the start of the tag: may yet think
            return None, text
        body = stripped[len(thinking.start):]
    end = body.find(thinking.end)
    if end < 0:
        return body if final else body[:len(body) - _partial_tag(body, thinking.end)], ""
    return body[:end], body[end + len(thinking.end):].lstrip()


def _partial_tag(text: str, tag: str) -> int:
    """The length of the longest end of `text` that begins `tag` (0 if none)."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


@dataclass
class ReplyReasoning:
    """The reasoning of one request's replies: split whole, or streamed as deltas."""

    thinking: ThinkingFormat
    sent: dict[int, int] = field(default_factory=dict)  # choice -> reasoning chars sent

    def split(self, text: str) -> tuple[str | None, str]:
        return split_reasoning(text, self.thinking)

    def delta(self, choice: int, text: str, final: bool) -> tuple[str, str]:
        """(new reasoning since the last call, the answer so far) of a streaming choice."""
        reasoning, answer = split_reasoning(text, self.thinking, final)
        reasoning = reasoning or ""
        sent = self.sent.get(choice, 0)
        self.sent[choice] = len(reasoning)
        return reasoning[sent:], answer
