"""/v1/embeddings over real HTTP with the official client: the vectors equal
sentence-transformers' on the same checkpoint, in every input form and encoding; bad bodies
are 400s naming the field while the server keeps serving; and each runner refuses the other's
API."""

from __future__ import annotations

import asyncio
import base64

import httpx
import numpy as np
import openai
import pytest
import torch
from embedding_support import HIDDEN_SIZE, make_embedding_model, st_embeddings
from model_support import REFERENCE
from server_support import async_openai_client, in_process_server

from tokenmill.engine.cli import parse_args

TEXTS = ["hello world", "a", "The capital of France is Paris, and Berlin is in Germany."]
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


@pytest.fixture(scope="module")
def embedding_model(tmp_path_factory, vocab_tokenizer):
    return make_embedding_model(str(tmp_path_factory.mktemp("embed")), vocab_tokenizer, "MEAN")


@pytest.fixture(scope="module")
def reference(embedding_model):
    return st_embeddings(embedding_model, TEXTS)


@pytest.fixture(scope="module")
def server(embedding_model):
    with in_process_server(embedding_model, "embedder", kv_cache_memory=16 << 20,
                           max_model_len=64, max_num_batched_tokens=16, max_num_seqs=8,
                           **REFERENCE) as server:
        yield server


def _vectors(response) -> torch.Tensor:
    return torch.tensor([item.embedding for item in response.data])


def _tokens(base_url: str, text: str) -> list[int]:
    return httpx.post(f"{base_url}/tokenize", json={"prompt": text}).json()["tokens"]


def test_the_client_gets_sentence_transformers_embeddings(client, base_url, reference):
    """The client asks for base64 unless told otherwise, and decodes it; floats too."""
    by_default = client.embeddings.create(model="embedder", input=TEXTS)
    as_floats = client.embeddings.create(model="embedder", input=TEXTS, encoding_format="float")
    torch.testing.assert_close(_vectors(by_default), reference, atol=1e-5, rtol=0)
    torch.testing.assert_close(_vectors(as_floats), reference, atol=1e-5, rtol=0)
    assert [item.index for item in by_default.data] == [0, 1, 2]
    assert by_default.model == "embedder" and by_default.object == "list"
    assert by_default.usage.prompt_tokens == by_default.usage.total_tokens == sum(
        len(_tokens(base_url, t)) for t in TEXTS)


def test_base64_is_little_endian_float32(base_url, reference):
    body = httpx.post(f"{base_url}/v1/embeddings", json={"input": TEXTS[0],
                                                         "encoding_format": "base64"}).json()
    vector = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), dtype="<f4")
    assert vector.shape == (HIDDEN_SIZE,)
    torch.testing.assert_close(torch.from_numpy(vector.copy()), reference[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("embed_dtype,torch_dtype", [
    ("float16", torch.float16), ("bfloat16", torch.bfloat16),
    ("fp8_e4m3", torch.float8_e4m3fn), ("fp8_e5m2", torch.float8_e5m2)])
@pytest.mark.parametrize("endianness", ["little", "big"])
def test_base64_in_vllms_embed_dtype_and_byte_order(base_url, embed_dtype, torch_dtype,
                                                     endianness):
    """vLLM's embed_dtype and endianness: the float reply's values in that type and order."""
    floats = httpx.post(f"{base_url}/v1/embeddings", json={"input": TEXTS[0]}).json()
    packed = httpx.post(f"{base_url}/v1/embeddings", json={
        "input": TEXTS[0], "encoding_format": "base64", "embed_dtype": embed_dtype,
        "endianness": endianness}).json()
    raw = np.frombuffer(base64.b64decode(packed["data"][0]["embedding"]), dtype=np.uint8)
    size = torch.tensor([], dtype=torch_dtype).element_size()
    rows = raw.reshape(-1, size)
    if endianness == "big" and size > 1:
        rows = rows[:, ::-1]
    decoded = torch.from_numpy(np.ascontiguousarray(rows).reshape(-1)).view(torch_dtype)
    want = torch.tensor(floats["data"][0]["embedding"]).to(torch_dtype)
    assert decoded.shape == (HIDDEN_SIZE,)
    assert torch.equal(decoded.float(), want.float())


def test_token_ids_embed_as_their_text(client, base_url, reference):
    ids = [_tokens(base_url, t) for t in TEXTS]
    one = client.embeddings.create(model="embedder", input=ids[2])
    many = client.embeddings.create(model="embedder", input=ids)
    torch.testing.assert_close(_vectors(one)[0], reference[2], atol=1e-5, rtol=0)
    torch.testing.assert_close(_vectors(many), reference, atol=1e-5, rtol=0)


def test_dimensions_normalize_and_truncation(client, base_url, embedding_model):
    cut = _vectors(client.embeddings.create(model="embedder", input=TEXTS[2], dimensions=8))
    raw = _vectors(client.embeddings.create(model="embedder", input=TEXTS[2],
                                            extra_body={"normalize": False}))
    assert cut.shape == (1, 8)
    torch.testing.assert_close(cut[0], torch.nn.functional.normalize(raw[0, :8], dim=0),
                               atol=1e-5, rtol=0)
    assert not torch.isclose(raw.norm(), torch.tensor(1.0))
    ids = _tokens(base_url, TEXTS[2])
    last_text = httpx.post(f"{base_url}/detokenize", json={"tokens": ids[-4:]}).json()["prompt"]
    assert _tokens(base_url, last_text) == ids[-4:]
    last = st_embeddings(embedding_model, [last_text])
    kept = _vectors(client.embeddings.create(model="embedder", input=TEXTS[2],
                                             extra_body={"truncate_prompt_tokens": 4}))
    torch.testing.assert_close(kept, last, atol=1e-5, rtol=0)


def test_a_conversation_embeds_through_the_chat_template(client, server_state):
    messages = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    server_state.options.chat_template = TEMPLATE
    try:
        got = client.post("/embeddings", cast_to=object,
                          body={"model": "embedder", "messages": messages})
    finally:
        server_state.options.chat_template = None
    rendered = client.embeddings.create(model="embedder", input="<user>hello<assistant>hi")
    assert got["data"][0]["embedding"] == pytest.approx(rendered.data[0].embedding, abs=1e-6)


def test_concurrent_requests_batch_and_each_gets_its_own(base_url, reference):
    async def run() -> list:
        client = async_openai_client(f"{base_url}/v1")
        calls = [client.embeddings.create(model="embedder", input=TEXTS[i % 3])
                 for i in range(12)]
        return await asyncio.gather(*calls)

    for i, response in enumerate(asyncio.run(run())):
        torch.testing.assert_close(_vectors(response)[0], reference[i % 3], atol=1e-5, rtol=0)


@pytest.mark.parametrize(("body", "message", "param"), [
    ({"input": ""}, "input: must not be empty", "input"),
    ({"input": []}, "input: must not be empty", "input"),
    ({"input": ["a", ""]}, "input: must not hold an empty text", "input"),
    ({"input": ["a"] * 2049}, "input: holds 2049 items; at most 2048", "input"),
    ({"input": "a", "messages": [{"role": "user", "content": "a"}]},
     "give either input or messages", "input"),
    ({}, "give either input or messages", "input"),
    ({"input": "a", "dimensions": HIDDEN_SIZE + 1},
     f"dimensions must be in [1, {HIDDEN_SIZE}]", "dimensions"),
    ({"input": "a", "dimensions": 0}, "greater than or equal to 1", "dimensions"),
    ({"input": "a", "encoding_format": "int8"}, "'float' or 'base64'", "encoding_format"),
    ({"input": [1, "a"]}, "", "input"),
    ({"input": [10**9]}, "prompt token ids must be integers in [0, ", "input"),
    ({"input": [5] * 65}, "maximum context length is 64 tokens, but the request asks for 65",
     "input"),
    ({"input": "a", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens: must be at least 1",
     "truncate_prompt_tokens"),
    ({"messages": [{"role": "user", "content": "a"}]}, "messages: the chat template", "messages"),
    ({"input": "a", "model": "other"}, "the model 'other' does not exist", "model"),
])
def test_bad_bodies_are_400s_naming_the_field(base_url, reference, body, message, param):
    response = httpx.post(f"{base_url}/v1/embeddings", json=body)
    error = response.json()["error"]
    assert response.status_code == (404 if param == "model" else 400), error
    assert message in error["message"]
    assert error["param"] == param
    ok = httpx.post(f"{base_url}/v1/embeddings", json={"input": TEXTS[0]}).json()
    torch.testing.assert_close(torch.tensor(ok["data"][0]["embedding"]), reference[0],
                               atol=1e-5, rtol=0)


def test_an_embedding_model_generates_nothing(client):
    with pytest.raises(openai.BadRequestError, match="served for embeddings") as error:
        client.chat.completions.create(model="embedder",
                                       messages=[{"role": "user", "content": "hi"}])
    assert error.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError, match="use /v1/embeddings"):
        client.completions.create(model="embedder", prompt="hi", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="served for embeddings"):
        client.responses.create(model="embedder", input="hi")


def test_a_generative_model_makes_no_embeddings(tiny_server):
    with pytest.raises(openai.BadRequestError, match="served for generation .* --runner "
                                                     "pooling") as error:
        tiny_server.client.embeddings.create(model="tiny", input="hi")
    assert error.value.body["param"] == "model"


@pytest.mark.parametrize(("flags", "runner"), [
    ([], "auto"), (["--runner", "pooling"], "pooling"), (["--convert", "embed"], "pooling"),
    (["--task", "embed"], "pooling"), (["--task", "generate"], "generate"),
    (["--convert", "none"], "auto"), (["--convert", "classify"], "pooling"),
    (["--task", "score"], "pooling"), (["--task", "classify"], "pooling"),
])
def test_vllm_runner_flags_pick_the_runner(flags, runner):
    assert parse_args(["serve", *flags]).runner == runner
