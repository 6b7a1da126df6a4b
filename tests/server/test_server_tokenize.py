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


def test_detokenize_round_trips(root, tokenizer):
    ids = _post(root, "/tokenize", prompt="Paris is the capital of France.")["tokens"]
    assert _post(root, "/detokenize", model="tiny", tokens=ids) == {
        "prompt": tokenizer.decode(ids, skip_special_tokens=False)}
    assert _post(root, "/detokenize", tokens=ids)["prompt"].endswith(
        "Paris is the capital of France.")
    assert _post(root, "/detokenize", tokens=[]) == {"prompt": ""}


@pytest.mark.parametrize("path,body,param", [
    ("/tokenize", {}, None),
    ("/tokenize", {"prompt": "x", "messages": HELLO}, None),
    ("/tokenize", {"prompt": 5}, "prompt"),
    ("/tokenize", {"prompt": "x", "add_special_tokens": "yes"}, "add_special_tokens"),
    ("/tokenize", {"messages": []}, "messages"),
    ("/tokenize", {"messages": HELLO, "continue_final_message": True}, None),
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
