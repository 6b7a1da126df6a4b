"""OpenAI's harmony format, as GPT-OSS writes its replies: a sequence of messages, each a
header and its content,

    <|channel|>analysis<|message|>THINKING<|end|>
    <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json
        <|message|>ARGS<|call|>
    <|start|>assistant<|channel|>final<|message|>ANSWER<|return|>

(the second message on one line).

The `analysis` channel is the model's thinking; `final` (and `commentary` without a recipient,
a preamble) is what it says; a message to `functions.NAME` is a tool call whose content is its
arguments. The markers are special tokens, so a reply is parsed from text decoded with them
kept. A reply may stop anywhere: an unfinished header says nothing yet, an unfinished message
is its content so far.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tokenmill.engine.server.partial_markers import partial_marker_length

MESSAGE = "<|message|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
MARKERS = ("<|start|>", "<|channel|>", MESSAGE, "<|constrain|>", *ENDS)
HEADER_STARTS = ("<|start|>", "<|channel|>")
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")


@dataclass(frozen=True)
class HarmonyMessage:
    channel: str | None
    recipient: str | None  # functions.NAME for a tool call
    content: str
    complete: bool = True  # its end marker has been written

    @property
    def thinking(self) -> bool:
        return self.channel == "analysis" and self.recipient is None


def is_harmony(text: str) -> bool:
    """Whether the reply is written in harmony (else it is plain text, all answer)."""
    return any(marker in text for marker in ("<|channel|>", MESSAGE, "<|start|>"))


def parse_messages(text: str, final: bool = True) -> list[HarmonyMessage]:
    """The reply's messages in order; text before a header (written without one) is a
    message of no channel. With final False (still streaming) a tail that may be the start of
    a marker is left out of the last message's content."""
    messages = []
    pos = 0
    while True:
        opened = text.find(MESSAGE, pos)
        if opened < 0:
            return messages  # what is left is a header still being written (or nothing)
        header = text[pos:opened]
        first = min((at for marker in HEADER_STARTS if (at := header.find(marker)) >= 0),
                    default=0)
        if first:  # said outside any message: the answer as the reasoning split leaves it
            messages.append(HarmonyMessage(None, None, header[:first]))
            header = header[first:]
        start = opened + len(MESSAGE)
        found = [(at, tag) for tag in ENDS if (at := text.find(tag, start)) >= 0]
        channel = _CHANNEL.search(header)
        recipient = _RECIPIENT.search(header)
        if found:
            end, tag = min(found)
            content, pos = text[start:end], end + len(tag)
        else:
            content, pos = text[start:], len(text)
            if not final:
                content = content[:len(content) - partial_marker_length(content, MARKERS)]
        messages.append(HarmonyMessage(channel and channel.group(1),
                                       recipient and recipient.group(1), content, bool(found)))
        if not found:
            return messages


def canonical(message: HarmonyMessage) -> str:
    """A message written back in harmony, as a later parser reads it (its end marker once it
    has one, so the text only grows as the message does)."""
    return (f"<|channel|>{message.channel or 'commentary'} to={message.recipient}"
            f"{MESSAGE}{message.content}{'<|call|>' if message.complete else ''}")


def held_plain(text: str, final: bool) -> str:
    """A reply without harmony markup: all of it, or while streaming all but a tail that may
    begin a marker."""
    return text if final else text[:len(text) - partial_marker_length(text, MARKERS)]
