"""/v1/completions with vLLM's `prompt_embeds` (--enable-prompt-embeds), through the official
openai client as vLLM's example sends them: base64 of torch.save, beside `prompt=""` or
beside text prompts (the embeddings' choices first). Replies equal the offline engine's;
what cannot be read is a 400 naming prompt_embeds, and the server goes on serving."""

from __future__ import annotations

import base64
import io
import os

import httpx
import openai
import pytest
import torch
from server_support import in_process_server, openai_client

from tokenmill.engine import LLM, SamplingParams

MAX_NEW = 6
ENGINE = dict(kv_cache_memory=16 << 20, max_model_len=256, enable_prompt_embeds=True)


def _saved(value) -> str:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return base64.b64encode(buffer.getvalue()).decode()


class _RunsCode:
    """A pickle that would run a command when loaded by a full unpickler."""

    def __reduce__(self):
        return (os.system, ("touch /tmp/tokenmill-prompt-embeds-pwned",))


@pytest.fixture(scope="module")
def rows(tiny_llama_dir) -> list[torch.Tensor]:
    """Two prompts' embeddings: the model's own rows of two token prompts, moved off them."""
    from safetensors.torch import load_file

    table = load_file(os.path.join(tiny_llama_dir, "model.safetensors"))[
        "model.embed_tokens.weight"]
    gen = torch.Generator().manual_seed(3)
    return [table[torch.randint(3, table.shape[0], (n,), generator=gen)] +
            0.2 * torch.randn(n, table.shape[1], generator=gen) for n in (7, 20)]


@pytest.fixture(scope="module")
def expected(tiny_llama_dir, rows) -> dict[str, str]:
    """The offline engine's greedy text for each prompt given as embeddings, and for one
    given as text."""
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    with LLM(tiny_llama_dir, show_progress=False, **ENGINE) as llm:
        outs = llm.generate([{"prompt_embeds": r} for r in rows] + ["the cat"], params)
    return {"first": outs[0].outputs[0].text, "second": outs[1].outputs[0].text,
            "text": outs[2].outputs[0].text}


@pytest.fixture(scope="module")
def server(tiny_llama_dir):
    with in_process_server(tiny_llama_dir, "tiny", **ENGINE) as server:
        yield server


def _create(server, **options):
    client = openai_client(f"{server.url}/v1")
    return client.completions.create(model="tiny", max_tokens=MAX_NEW, temperature=0.0,
                                     extra_body={"ignore_eos": True,
                                                 **options.pop("extra", {})}, **options)


def test_the_openai_client_sends_embeddings_as_vllms_example_does(server, rows, expected):
    reply = _create(server, prompt="", extra={"prompt_embeds": _saved(rows[0])})
    assert [c.text for c in reply.choices] == [expected["first"]]
    assert reply.usage.prompt_tokens == 7 and reply.usage.completion_tokens == MAX_NEW
    # A batch of one, as a model's embedding layer returns it.
    reply = _create(server, prompt="", extra={"prompt_embeds": _saved(rows[0][None])})
    assert reply.choices[0].text == expected["first"]


def test_embeddings_come_before_text_prompts_and_stream_alike(server, rows, expected):
    body = dict(prompt="the cat", extra={"prompt_embeds": [_saved(r) for r in rows],
                                         "return_token_ids": True})
    reply = _create(server, **body)
    assert [c.text for c in reply.choices] == [expected["first"], expected["second"],
                                               expected["text"]]
    ids = [c.model_extra["prompt_token_ids"] for c in reply.choices]
    assert ids[0] is None and ids[1] is None and ids[2]
    assert reply.usage.prompt_tokens == 7 + 20 + len(ids[2])
    texts = ["", "", ""]
    for chunk in _create(server, stream=True, **body):
        for c in chunk.choices:
            texts[c.index] += c.text
    assert texts == [c.text for c in reply.choices]


def test_truncation_keeps_the_last_rows(server, rows):
    reply = _create(server, prompt="", extra={"prompt_embeds": _saved(rows[1]),
                                              "truncate_prompt_tokens": 5})
    again = _create(server, prompt="", extra={"prompt_embeds": _saved(rows[1][-5:])})
    assert reply.usage.prompt_tokens == 5
    assert reply.choices[0].text == again.choices[0].text


def test_what_cannot_be_read_is_a_400_naming_the_field(server, rows):
    bad = [
        ("not base64", "%%%"),
        ("not a tensor saved by torch.save", base64.b64encode(b"plain bytes").decode()),
        ("holds a dict", _saved({"rows": rows[0]})),
        ("shape [tokens, 64]", _saved(rows[0][:, :10])),
        ("shape [tokens, 64]", _saved(rows[0][0])),
        ("dense", _saved(rows[0].to_sparse())),
        ("not finite", _saved(torch.full((3, 64), float("inf")))),
        ("not a tensor saved", _saved(_RunsCode())),
    ]
    client = openai_client(f"{server.url}/v1")
    for words, value in bad:
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model="tiny", prompt="", max_tokens=2,
                                      extra_body={"prompt_embeds": value})
        error = refused.value.body
        assert words in error["message"] and error["param"] == "prompt_embeds", error
    assert not os.path.exists("/tmp/tokenmill-prompt-embeds-pwned")
    with httpx.Client(timeout=30) as http:
        for body, field in (({"prompt_embeds": _saved(rows[0]), "echo": True}, "echo"),
                            ({"prompt_embeds": []}, "prompt_embeds"),
                            ({"prompt_embeds": _saved(rows[0]), "prompt_logprobs": 1},
                             "prompt_logprobs")):
            r = http.post(f"{server.url}/v1/completions", json={"model": "tiny", **body})
            assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    assert _create(server, prompt="", extra={"prompt_embeds": _saved(rows[0])}).choices


def test_a_server_without_the_flag_names_it(tiny_llama_dir, rows):
    with (in_process_server(tiny_llama_dir, "tiny", kv_cache_memory=16 << 20,
                            max_model_len=256) as server,
          pytest.raises(openai.BadRequestError, match="--enable-prompt-embeds")):
        _create(server, prompt="", extra={"prompt_embeds": _saved(rows[0])})
