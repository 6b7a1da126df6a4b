"""vLLM's return_token_ids (the prompt's and each choice's token ids in the reply, whole or
streamed chunk by chunk), truncate_prompt_tokens (a prompt's last K tokens run) and
add_special_tokens (a tokenizer's BOS: added to a completion's text by default, not to a chat's
rendered template) on the completion and chat routes."""

from __future__ import annotations

import shutil

import httpx
import pytest
from server_support import in_process_server, stream_chunks

PROMPT = "The capital of France is Paris, and the capital of Germany is"
MESSAGES = [{"role": "user", "content": "Name three rivers of Europe."}]
GREEDY = {"max_tokens": 8, "temperature": 0, "ignore_eos": True}


def _post(server, path: str, body: dict) -> dict:
    reply = httpx.post(server.url + path, json={"model": "tiny", **body}, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()


def _chunks(server, path: str, body: dict) -> list[dict]:
    return stream_chunks(server.url, path, {"model": "tiny", **body})


def _encoded(server, text: str) -> list[int]:
    return _post(server, "/tokenize", {"prompt": text})["tokens"]


def test_completions_return_the_prompts_and_choices_token_ids(tiny_server):
    body = {"prompt": [PROMPT, "Hello"], "n": 2, "return_token_ids": True, **GREEDY}
    reply = _post(tiny_server, "/v1/completions", body)
    prompts = [_encoded(tiny_server, PROMPT), _encoded(tiny_server, "Hello")]
    assert [c["prompt_token_ids"] for c in reply["choices"]] == \
        [prompts[0], prompts[0], prompts[1], prompts[1]]
    assert all(len(c["token_ids"]) == 8 for c in reply["choices"])
    assert reply["usage"]["completion_tokens"] == 4 * 8
    plain = _post(tiny_server, "/v1/completions", {"prompt": PROMPT, **GREEDY})
    assert "token_ids" not in plain["choices"][0] and "prompt_token_ids" not in plain["choices"][0]
    detokenized = _post(tiny_server, "/detokenize", {"tokens": reply["choices"][0]["token_ids"]})
    assert detokenized["prompt"] == reply["choices"][0]["text"] == plain["choices"][0]["text"]


def test_streamed_completions_send_each_token_id_once(tiny_server):
    body = {"prompt": PROMPT, "return_token_ids": True, **GREEDY}
    whole = _post(tiny_server, "/v1/completions", body)["choices"][0]
    chunks = [c["choices"][0] for c in _chunks(tiny_server, "/v1/completions", body)
              if c["choices"]]
    assert chunks[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    assert all("prompt_token_ids" not in c for c in chunks[1:])
    assert [t for c in chunks for t in c["token_ids"]] == whole["token_ids"]


def test_chat_returns_the_rendered_prompts_ids_and_the_replys(tiny_server):
    body = {"messages": MESSAGES, "return_token_ids": True, **GREEDY}
    whole = _post(tiny_server, "/v1/chat/completions", body)
    rendered = _post(tiny_server, "/tokenize", {"messages": MESSAGES})["tokens"]
    assert whole["prompt_token_ids"] == rendered
    assert len(whole["choices"][0]["token_ids"]) == whole["usage"]["completion_tokens"] == 8
    chunks = _chunks(tiny_server, "/v1/chat/completions", body)
    assert chunks[0]["prompt_token_ids"] == rendered
    assert all("prompt_token_ids" not in c for c in chunks[1:])
    streamed = [t for c in chunks[1:] for choice in c["choices"] for t in choice["token_ids"]]
    assert streamed == whole["choices"][0]["token_ids"]


def test_truncate_prompt_tokens_runs_the_prompts_last_tokens(tiny_server):
    ids = _encoded(tiny_server, PROMPT)
    cut = _post(tiny_server, "/v1/completions", {"prompt": PROMPT, "truncate_prompt_tokens": 4,
                                                 "echo": True, "return_token_ids": True,
                                                 **GREEDY})
    tail = _post(tiny_server, "/v1/completions", {"prompt": ids[-4:], **GREEDY})
    choice = cut["choices"][0]
    assert cut["usage"]["prompt_tokens"] == 4 and choice["prompt_token_ids"] == ids[-4:]
    echoed = _post(tiny_server, "/detokenize", {"tokens": ids[-4:]})["prompt"]
    assert choice["text"] == echoed + tail["choices"][0]["text"]
    chat = _post(tiny_server, "/v1/chat/completions", {
        "messages": MESSAGES, "truncate_prompt_tokens": 5, "return_token_ids": True, **GREEDY})
    rendered = _post(tiny_server, "/tokenize", {"messages": MESSAGES})["tokens"]
    assert chat["prompt_token_ids"] == rendered[-5:] and chat["usage"]["prompt_tokens"] == 5


@pytest.mark.parametrize("value", [0, -2, "4"])
def test_a_bad_truncation_is_a_400_naming_it(tiny_server, value):
    reply = httpx.post(tiny_server.url + "/v1/completions",
                       json={"prompt": PROMPT, "truncate_prompt_tokens": value}, timeout=60)
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "truncate_prompt_tokens"


@pytest.fixture(scope="module")
def bos_server(tiny_llama_dir, vocab_tokenizer, tmp_path_factory):
    """The tiny model with a tokenizer that puts token 0 before every text it encodes."""
    from tokenizers.processors import TemplateProcessing

    directory = tmp_path_factory.mktemp("bos") / "model"
    shutil.copytree(tiny_llama_dir, directory)
    bos = vocab_tokenizer.convert_ids_to_tokens(0)
    tokenizer = vocab_tokenizer.__class__.from_pretrained(tiny_llama_dir)
    tokenizer._tokenizer.post_processor = TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, 0)])
    tokenizer.save_pretrained(directory)
    with in_process_server(str(directory), "tiny", max_model_len=128) as server:
        yield server


def test_special_tokens_are_added_to_text_prompts_but_not_to_a_rendered_chat(bos_server):
    plain = _encoded(bos_server, PROMPT)
    assert plain[0] == 0
    default = _post(bos_server, "/v1/completions", {"prompt": PROMPT, "return_token_ids": True,
                                                    **GREEDY})["choices"][0]
    bare = _post(bos_server, "/v1/completions", {"prompt": PROMPT, "return_token_ids": True,
                                                 "add_special_tokens": False,
                                                 **GREEDY})["choices"][0]
    assert default["prompt_token_ids"] == plain and bare["prompt_token_ids"] == plain[1:]
    chat = {"messages": MESSAGES, "return_token_ids": True, **GREEDY}
    rendered = _post(bos_server, "/v1/chat/completions", chat)["prompt_token_ids"]
    added = _post(bos_server, "/v1/chat/completions",
                  {**chat, "add_special_tokens": True})["prompt_token_ids"]
    assert rendered[0] != 0 and added == [0, *rendered]
