"""Reasoning models' thinking, split from their answer (vLLM's --reasoning-parser).

Every format thinks between a start and an end tag, then answers:
- `qwen3`: the model writes `<think>` itself; a reply that does not start with it (thinking
  turned off by `chat_template_kwargs: {"enable_thinking": false}`) is all answer.
- `deepseek_r1`: the chat template opens `<think>` in the prompt, so the reply starts inside
  the thinking; everything up to `</think>` is reasoning.
- `mistral`: Magistral writes `[THINK]` ... `[/THINK]` itself, as Qwen3 writes its tags.
- `granite`: Granite 3.2+ (with `chat_template_kwargs: {"thinking": true}`) writes "Here is
  my thought process:" ... "Here is my response:" (or "Here's"), in words rather than tags.
- `deepseek_v3`: DeepSeek-V3.1 thinks only where the request turns it on
  (`chat_template_kwargs: {"thinking": true}`, or `enable_thinking`), and then as R1 does: the
  template opens `<think>` in the prompt. Otherwise the whole reply is the answer.
- `minimax_m2`: MiniMax-M2's template opens `<think>` in the prompt, as R1's does.
  `minimax_m2_append_think` splits nothing: the answer is the whole reply with the `<think>`
  the prompt opened put back in front, so a client that sends the reply back keeps the
  thinking MiniMax-M2 expects to see again.
- `openai_gptoss`: GPT-OSS thinks in harmony's `analysis` channel and answers in `final`
  (server/harmony.py); its markers are special tokens, so its replies are decoded with them.
  Tool calls (messages to `functions.NAME`) stay in the answer, in harmony, for the `openai`
  tool-call parser.

The answer after the end tag loses its leading blank lines. A reply cut off while thinking is
all reasoning, with no answer. While a reply streams, a tail that may be the start of a tag
is held back until the next text shows what it is, so what is sent never has to be taken
back and the streamed pieces join to the whole reply's split.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenmill.engine.server.harmony import canonical, held_plain, is_harmony, parse_messages
from tokenmill.engine.server.partial_markers import partial_marker_length


@dataclass(frozen=True)
class ThinkingFormat:
    starts_inside: bool  # the chat template has opened the thinking already
    # Each tag's spellings, any of which opens (closes) the thinking.
    starts: tuple[str, ...] = ("<think>",)
    ends: tuple[str, ...] = ("</think>",)
    keeps_special_tokens = False  # its tags are read from the text as decoded

    def split(self, text: str, final: bool = True) -> tuple[str | None, str]:
        return split_reasoning(text, self, final)


@dataclass(frozen=True)
class HarmonyFormat:
    """GPT-OSS's channels: analysis is the reasoning; the answer is the other messages'
    content, tool calls kept in harmony."""

    keeps_special_tokens = True  # harmony's markers are special tokens

    def split(self, text: str, final: bool = True) -> tuple[str | None, str]:
        if not is_harmony(text):
            return None, held_plain(text, final)
        messages = parse_messages(text, final)
        thinking = [m.content for m in messages if m.thinking]
        # A call ends the reply (<|call|> stops it), so the answer only grows: what was said,
        # then the call.
        answer = "".join(m.content for m in messages if not m.thinking and not m.recipient) + \
            "".join(canonical(m) for m in messages if m.recipient)
        return ("".join(thinking) if thinking else None), answer


@dataclass(frozen=True)
class PrefixedThinking:
    """No split: the answer is the reply with the thinking's opening tag (which the prompt
    holds) put back in front."""

    start: str = "<think>"
    keeps_special_tokens = False

    def split(self, text: str, final: bool = True) -> tuple[str | None, str]:
        return None, self.start + text


@dataclass(frozen=True)
class RequestedThinking:
    """A model that thinks only where the request's chat_template_kwargs turn thinking on
    (DeepSeek-V3.1's `thinking`, or `enable_thinking`), then in format `when_on`."""

    when_on: ThinkingFormat
    keeps_special_tokens = False

    def split(self, text: str, final: bool = True) -> tuple[str | None, str]:
        """The split of a reply whose request turned thinking on."""
        return self.when_on.split(text, final)

    def for_request(self, template_kwargs: dict | None) -> ThinkingFormat | None:
        """The request's format; None where it does not think (the reply is all answer)."""
        kwargs = template_kwargs or {}
        on = kwargs.get("thinking", kwargs.get("enable_thinking", False))
        return self.when_on if on is True else None


def _granite(tag: str) -> tuple[str, ...]:
    return (f"Here is my {tag}:", f"Here's my {tag}:")


REASONING_PARSERS = {"deepseek_r1": ThinkingFormat(starts_inside=True),
                     "qwen3": ThinkingFormat(starts_inside=False),
                     "mistral": ThinkingFormat(False, ("[THINK]",), ("[/THINK]",)),
                     "granite": ThinkingFormat(False, _granite("thought process"),
                                               _granite("response")),
                     "openai_gptoss": HarmonyFormat(),
                     "deepseek_v3": RequestedThinking(ThinkingFormat(starts_inside=True)),
                     "minimax_m2": ThinkingFormat(starts_inside=True),
                     "minimax_m2_append_think": PrefixedThinking(),
                     # GLM-4.5 writes <think> itself, as Qwen3 does (an empty pair where its
                     # template turns thinking off).
                     "glm45": ThinkingFormat(starts_inside=False)}


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
        held = partial_marker_length(body, thinking.ends)
        return body if final else body[:len(body) - held], ""
    end, tag = min(found)
    return body[:end], body[end + len(tag):].lstrip()


@dataclass
class ReplyReasoning:
    """The reasoning of one request's replies: split whole, or streamed as deltas."""

    thinking: ThinkingFormat | HarmonyFormat | PrefixedThinking
    sent: dict[int, int] = field(default_factory=dict)  # choice -> reasoning chars sent

    def split(self, text: str) -> tuple[str | None, str]:
        return self.thinking.split(text)

    def delta(self, choice: int, text: str, final: bool) -> tuple[str, str]:
        """(new reasoning since the last call, the answer so far) of a streaming choice."""
        reasoning, answer = self.thinking.split(text, final)
        reasoning = reasoning or ""
        sent = self.sent.get(choice, 0)
        self.sent[choice] = len(reasoning)
        return reasoning[sent:], answer
