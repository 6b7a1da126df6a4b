"""vLLM's /tokenize and /detokenize, through the official client's generic post()."""

from __future__ import annotations

import openai
import pytest
from server_support import openai_client

HELLO = [{"role": "user", "content": "Hello there"}]


@pytest.fixture(scope="module")
def root(tiny_server):
    return openai_client(tiny_server.url)


@pytest.fixture(scope="module")
def tokenizer(tiny_server):
    return tiny_server.state.tokenizer


def _post(root, path: str, **body) -> dict:
    return root.post(path, body=body, cast_to=object)


def test_tokenize_a_prompt(root, tokenizer, tiny_server):
    r = _post(root, "/tokenize", model="tiny", prompt="The sky is blue")
    ids = tokenizer.encode("The sky is blue")
    assert r == {"count": len(ids), "max_model_len": tiny_server.state.max_model_len,
                 "tokens": ids, "token_strs": None}
    plain = _post(root, "/tokenize", prompt="The sky is blue", add_special_tokens=False)
    assert plain["tokens"] == tokenizer.encode("The sky is blue", add_special_tokens=False)
    strs = _post(root, "/tokenize", prompt="The sky", return_token_strs=True)
    assert strs["token_strs"] == tokenizer.convert_ids_to_tokens(strs["tokens"])


def test_tokenize_messages_counts_what_chat_completions_counts(root, tiny_server, tokenizer):
    r = _post(root, "/tokenize", messages=HELLO)
    assert r["tokens"] == tokenizer.apply_chat_template(HELLO, add_generation_prompt=True,
                                                        tokenize=True, return_dict=False)
    chat = tiny_server.client
    reply = chat.chat.completions.create(model="tiny", messages=HELLO, max_tokens=1)
    assert reply.usage.prompt_tokens == r["count"]
    no_prompt = _post(root, "/tokenize", messages=HELLO, add_generation_prompt=False)
    assert r["tokens"][:no_prompt["count"]] == no_prompt["tokens"]
    assert no_prompt["count"] < r["count"]
    prefill = HELLO + [{"role": "assistant", "content": "Hi! I am"}]
    cont = _post(root, "/tokenize", messages=prefill, add_generation_prompt=False,
                 continue_final_message=True)
    assert tokenizer.decode(cont["tokens"]).endswith("Hi! I am")


THINKING_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:"
    "{% if enable_thinking is defined and not enable_thinking %} no thinking{% endif %}"
    "{% endif %}")


@pytest.fixture
def thinking_template(tiny_server, tokenizer):
    """The tiny server's tokenizer with a template that reads `enable_thinking` (as Qwen3's
    does), for one test."""
    saved = tokenizer.chat_template
    tokenizer.chat_template = THINKING_TEMPLATE
    try:
        yield tokenizer
    finally:
        tokenizer.chat_template = saved


TOOLS_TEMPLATE = (
    "{% if tools %}tools: {% for t in tools %}{{ t['function']['name'] }} {% endfor %}\n"
    "{% endif %}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]


def test_tokenize_with_tools_counts_what_a_chat_with_them_counts(root, tiny_server,
                                                                  tokenizer):
    """vLLM's /tokenize `tools`: rendered as a chat request renders them."""
    saved = tokenizer.chat_template
    tokenizer.chat_template = TOOLS_TEMPLATE
    try:
        r = _post(root, "/tokenize", messages=HELLO, tools=TOOLS)
        assert tokenizer.decode(r["tokens"]).startswith("tools: get_weather")
        reply = tiny_server.client.chat.completions.create(
            model="tiny", messages=HELLO, max_tokens=1, tools=TOOLS, tool_choice="required")
        assert reply.usage.prompt_tokens == r["count"]
        assert _post(root, "/tokenize", messages=HELLO)["count"] < r["count"]
        with pytest.raises(openai.BadRequestError, match="tools"):
            _post(root, "/tokenize", messages=HELLO, tools=[{"type": "function"}])
    finally:
        tokenizer.chat_template = saved


def test_chat_template_kwargs_reach_the_template(root, tiny_server, thinking_template):
    """vLLM's chat_template_kwargs: variables of the template, on /tokenize and on chat
    completions alike (the prompt a chat request runs is the one /tokenize shows)."""
    off = {"enable_thinking": False}
    plain = _post(root, "/tokenize", messages=HELLO)
    quiet = _post(root, "/tokenize", messages=HELLO, chat_template_kwargs=off)
    assert quiet["tokens"] == thinking_template.apply_chat_template(
        HELLO, add_generation_prompt=True, tokenize=True, return_dict=False, enable_thinking=False)
    assert thinking_template.decode(quiet["tokens"]).endswith("no thinking")
    assert quiet["count"] > plain["count"]
    chat = tiny_server.client.chat.completions
    for kwargs, expected in ((None, plain), (off, quiet)):
        reply = chat.create(model="tiny", messages=HELLO, max_tokens=1,
                            extra_body={"chat_template_kwargs": kwargs})
        assert reply.usage.prompt_tokens == expected["count"]


def test_a_chat_completion_continues_the_final_message(root, tiny_server, tokenizer):
    """continue_final_message: the prompt ends inside the assistant's partial message (no end
    of turn, no new turn), as /tokenize renders it."""
    prefill = HELLO + [{"role": "assistant", "content": "Hi! I am"}]
    fields = {"add_generation_prompt": False, "continue_final_message": True}
    rendered = _post(root, "/tokenize", messages=prefill, **fields)
    assert tokenizer.decode(rendered["tokens"]).endswith("Hi! I am")
    reply = tiny_server.client.chat.completions.create(
        model="tiny", messages=prefill, max_tokens=1, extra_body=fields)
    assert reply.usage.prompt_tokens == rendered["count"]
    opened = _post(root, "/tokenize", messages=prefill)
    assert opened["count"] > rendered["count"]


@pytest.mark.parametrize("fields,param", [
    ({"continue_final_message": True}, "continue_final_message"),
    ({"chat_template_kwargs": {"tokenize": False}}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
    ({"chat_template_kwargs": ["enable_thinking"]}, "chat_template_kwargs"),
])
def test_bad_chat_template_fields_are_400(tiny_server, fields, param):
    with pytest.raises(openai.BadRequestError) as info:
        tiny_server.client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=1,
                                                   extra_body=fields)
    assert info.value.body["param"] == param


def test_a_chat_template_file_replaces_the_tokenizers(root, tiny_server, tokenizer, tmp_path):
    """--chat-template: the file's template, read at start-up, renders chats and /tokenize."""
    from tokenmill.engine.server.serve import read_chat_template

    path = tmp_path / "chat.jinja"
    path.write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
                    "{% if add_generation_prompt %}[assistant]{% endif %}")
    options = tiny_server.state.options
    options.chat_template = read_chat_template(str(path))
    try:
        rendered = _post(root, "/tokenize", messages=HELLO)
        reply = tiny_server.client.chat.completions.create(model="tiny", messages=HELLO,
                                                           max_tokens=1)
    finally:
        options.chat_template = None
    assert tokenizer.decode(rendered["tokens"]).endswith("[user] Hello there\n[assistant]")
    assert reply.usage.prompt_tokens == rendered["count"]
    assert _post(root, "/tokenize", messages=HELLO) != rendered  # the tokenizer's own again


def test_detokenize_round_trips(root, tokenizer):
    ids = _post(root, "/tokenize", prompt="Paris is the capital of France.")["tokens"]
    assert _post(root, "/detokenize", model="tiny", tokens=ids) == {
        "prompt": tokenizer.decode(ids, skip_special_tokens=False)}
    assert _post(root, "/detokenize", tokens=ids)["prompt"].endswith(
        "Paris is the capital of France.")
    assert _post(root, "/detokenize", tokens=[]) == {"prompt": ""}


@pytest.mark.parametrize("path,body,param", [
    ("/tokenize", {}, "prompt"),
    ("/tokenize", {"prompt": "x", "messages": HELLO}, "prompt"),
    ("/tokenize", {"prompt": 5}, "prompt"),
    ("/tokenize", {"prompt": "x", "add_special_tokens": "yes"}, "add_special_tokens"),
    ("/tokenize", {"messages": []}, "messages"),
    ("/tokenize", {"messages": HELLO, "continue_final_message": True},
     "continue_final_message"),
    ("/tokenize", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages"),
    ("/detokenize", {"tokens": [-1]}, "tokens"),
    ("/detokenize", {"tokens": [10**9]}, "tokens"),
    ("/detokenize", {"tokens": ["1"]}, "tokens"),
    ("/detokenize", {}, "tokens"),
])
def test_bad_bodies_are_400(root, path, body, param):
    with pytest.raises(openai.BadRequestError) as info:
        _post(root, path, **body)
    assert info.value.body["param"] == param


def test_another_models_name_is_404(root):
    for path, body in (("/tokenize", {"prompt": "x"}), ("/detokenize", {"tokens": [1]})):
        with pytest.raises(openai.NotFoundError) as info:
            _post(root, path, model="gpt-5", **body)
        assert info.value.body["code"] == "model_not_found"
