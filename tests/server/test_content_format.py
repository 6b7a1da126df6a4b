"""vLLM's --chat-template-content-format: a template written for a multimodal processor
(LLaVA's loops over a message's parts and prints only the text ones) gets each message's
content as OpenAI's list of parts; an ordinary template gets the string. `auto` finds out
which from the template itself; `string` and `openai` force one."""

from __future__ import annotations

import pytest
from server_support import openai_client

from tokenmill.engine.cli import parse_args
from tokenmill.engine.frontend.content_format import detect_content_format, in_content_format

# LLaVA-1.5's processor template, in short: text parts only, images first.
PARTS_TEMPLATE = (
    "{% for message in messages %}{{ message['role'].upper() + ': ' }}"
    "{% for part in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ part['text'] + ' ' }}{% endfor %}{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}")
STRING_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                   "{% if add_generation_prompt %}assistant:{% endif %}")
# Gemma 3's way: a string or a list of parts, either printed.
BOTH_TEMPLATE = (
    "{% for m in messages %}{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for p in m['content'] %}{{ p['text'] }}{% endfor %}{% endif %}{% endfor %}")
MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Name a"},
                                         {"type": "text", "text": "color."}]},
            {"role": "assistant", "content": "Red."}, {"role": "user", "content": "Another?"}]


@pytest.fixture
def template(tiny_server):
    """The tiny server with --chat-template set by the test, restored after."""
    options = tiny_server.state.options
    saved = options.chat_template, options.chat_template_content_format

    def use(text: str, content_format: str = "auto") -> None:
        options.chat_template, options.chat_template_content_format = text, content_format

    yield use
    options.chat_template, options.chat_template_content_format = saved


def _prompt(tiny_server) -> str:
    """The prompt /tokenize renders for MESSAGES (what a chat completion runs)."""
    root = openai_client(tiny_server.url)
    tokens = root.post("/tokenize", body={"messages": MESSAGES}, cast_to=object)["tokens"]
    return tiny_server.state.tokenizer.decode(tokens)


def test_a_template_that_reads_parts_gets_parts(tiny_server, template):
    template(PARTS_TEMPLATE)
    assert _prompt(tiny_server) == ("SYSTEM: Be brief. USER: Name a color. ASSISTANT: Red. "
                                    "USER: Another? ASSISTANT:")
    reply = tiny_server.client.chat.completions.create(model="tiny", messages=MESSAGES,
                                                       max_tokens=1)
    assert reply.usage.prompt_tokens == len(tiny_server.state.tokenizer.encode(
        _prompt(tiny_server), add_special_tokens=False))


def test_a_template_that_reads_strings_gets_strings(tiny_server, template):
    template(STRING_TEMPLATE)
    # The parts one a line, as vLLM joins them for such a template.
    assert _prompt(tiny_server) == ("system: Be brief.\nuser: Name a\ncolor.\nassistant: Red."
                                    "\nuser: Another?\nassistant:")


def test_the_flag_forces_a_format(tiny_server, template):
    template(PARTS_TEMPLATE, "string")  # what a string gives this template: no text at all
    assert _prompt(tiny_server) == "SYSTEM: USER: ASSISTANT: USER: ASSISTANT:"
    template(STRING_TEMPLATE, "openai")
    assert "'type': 'text'" in _prompt(tiny_server)


def test_detection(tiny_server):
    tokenizer = tiny_server.state.tokenizer
    assert detect_content_format(tokenizer, PARTS_TEMPLATE) == "openai"
    assert detect_content_format(tokenizer, STRING_TEMPLATE) == "string"
    assert detect_content_format(tokenizer, BOTH_TEMPLATE) == "string"
    # With images, parts wherever the template prints them: it places the images itself.
    assert detect_content_format(tokenizer, BOTH_TEMPLATE, images=True) == "openai"
    assert detect_content_format(tokenizer, STRING_TEMPLATE, images=True) == "string"
    # A template that shows neither form keeps the string.
    assert detect_content_format(tokenizer, "{{ 'fixed' }}") == "string"
    assert in_content_format([{"role": "assistant", "content": None}], "openai") == [
        {"role": "assistant", "content": None}]


def test_the_flag_takes_vllms_values():
    assert parse_args(["serve", "--chat-template-content-format", "openai"]
                      ).chat_template_content_format == "openai"
    assert parse_args(["serve"]).chat_template_content_format == "auto"
    with pytest.raises(SystemExit):
        parse_args(["serve", "--chat-template-content-format", "parts"])
