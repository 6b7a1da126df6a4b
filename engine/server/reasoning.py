"""Reasoning models' thinking, split from their answer (vLLM's --reasoning-parser).

Every format thinks between a start and an end tag, then answers:
- `qwen3`: the model writes `<think>` itself; a reply that does not start with it (thinking
  turned off by `chat_template_kwargs: {"enable_thinking": false}`) is all answer.
- `deepseek_r1`: the chat template opens `<think>` in the prompt, so the reply starts inside
  the thinking; everything up to `</think>` is reasoning.
- `mistral`: Magistral writes `[THINK]` ... `[/THINK]` itself, as Qwen3 writes its tags.
- `granite`: Granite 3.2+ (with `chat_template_kwargs: {"thinking": true}`) writes "Here is
  my thought process:" ... "Here is my response:" (or "Here's"), in words rather than tags.

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
    # Each tag's spellings, any of which opens (closes) the thinking.
    starts: tuple[str, ...] = ("<think>",)
    ends: tuple[str, ...] = ("</think>",)


def _granite(tag: str) -> tuple[str, ...]:
    return (f"Here is my {tag}:", f"Here's my {tag}:")


REASONING_PARSERS = {"deepseek_r1": ThinkingFormat(starts_inside=True),
                     "qwen3": ThinkingFormat(starts_inside=False),
                     "mistral": ThinkingFormat(False, ("[THINK]",), ("[/THINK]",)),
                     "granite": ThinkingFormat(False, _granite("thought process"),
                                               _granite("response"))}


def split_reasoning(text: str, thinking: ThinkingFormat,
                    final: bool = True) -> tuple[str | None, str]:
    """(reasoning, answer) of a reply; reasoning None when the reply does not think. With
    final False (a reply still streaming), a possible partial tag at the end is left out."""
    body = text
    if not thinking.starts_inside:
        stripped = text.lstrip()
        start = next((tag for tag in thinking.starts if stripped.startswith(tag)), None)
        if start is None:
            if not final and any(tag.startswith(stripped) for tag in thinking.starts):
                return None, ""  # blank so far, or the start of a tag: may yet think
            return None, text
        body = stripped[len(start):]
    found = [(at, tag) for tag in thinking.ends if (at := body.find(tag)) >= 0]
    if not found:
        held = max(_partial_tag(body, tag) for tag in thinking.ends)
        return body if final else body[:len(body) - held], ""
    end, tag = min(found)
    return body[:end], body[end + len(tag):].lstrip()


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
