"""`tokenmill serve --skip-tokenizer-init`: a checkpoint without tokenizer files serves
/v1/completions of token ids (the reply's tokens in `token_ids`, its text empty, logprobs
naming tokens by id, a stream's chunks carrying them as they come); what needs text is a 400
naming the flag."""

from __future__ import annotations

import glob
import os
import shutil

import httpx
import openai
import pytest
from server_support import ServeProcess, openai_client

from tokenmill.engine import LLM, SamplingParams

PROMPT = [5, 6, 7, 8]
MAX_NEW = 5


@pytest.fixture(scope="module")
def untokenized(tiny_llama_dir, tmp_path_factory) -> str:
    directory = shutil.copytree(tiny_llama_dir, tmp_path_factory.mktemp("m") / "untokenized")
    for path in glob.glob(os.path.join(directory, "*token*")):
        os.remove(path)
    return str(directory)


@pytest.fixture(scope="module")
def expected(untokenized) -> list[int]:
    with LLM(untokenized, skip_tokenizer_init=True, show_progress=False,
             kv_cache_memory=16 << 20) as llm:
        out = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=MAX_NEW,
                                                    ignore_eos=True))
    return out[0].outputs[0].token_ids


@pytest.fixture(scope="module")
def server(untokenized):
    """The server as a user starts it, with the flag on the command line."""
    proc = ServeProcess(untokenized, "--skip-tokenizer-init", "--served-model-name", "tiny",
                        "--kv-cache-memory", "16M")
    try:
        proc.wait_healthy(120)
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_token_ids_in_token_ids_out(server, expected):
    client = openai_client(f"{server.url}/v1")
    extra = {"ignore_eos": True, "return_token_ids": True}
    reply = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=MAX_NEW,
                                      temperature=0.0, logprobs=1, extra_body=extra)
    choice = reply.choices[0]
    assert choice.text == "" and choice.model_extra["token_ids"] == expected
    assert choice.logprobs.tokens == [f"token_id:{t}" for t in expected]
    assert reply.usage.completion_tokens == MAX_NEW
    chunks = [c.choices[0].model_extra["token_ids"] for c in client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=MAX_NEW, temperature=0.0, stream=True,
        extra_body=extra) if c.choices]
    # A chunk per step the reader keeps up with (one that falls behind gets the steps joined).
    assert [t for chunk in chunks for t in chunk] == expected and all(chunks)


def test_what_needs_text_is_a_400_naming_the_flag(server):
    client = openai_client(f"{server.url}/v1")
    with pytest.raises(openai.BadRequestError, match="--skip-tokenizer-init") as refused:
        client.completions.create(model="tiny", prompt="hello", max_tokens=2)
    assert refused.value.body["param"] == "prompt"
    with pytest.raises(openai.BadRequestError, match="--skip-tokenizer-init"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user",
                                                                "content": "hi"}])
    for extra, field in (({"echo": True}, "echo"), ({"stop": ["x"]}, "stop"),
                         ({"use_beam_search": True}, "use_beam_search")):
        with pytest.raises(openai.BadRequestError, match="tokenizer") as refused:
            client.completions.create(model="tiny", prompt=PROMPT, max_tokens=2,
                                      extra_body=extra)
        assert refused.value.body["param"] == field
    with httpx.Client(timeout=30) as http:
        r = http.post(f"{server.url}/tokenize", json={"model": "tiny", "prompt": "x"})
        assert r.status_code == 400 and "--skip-tokenizer-init" in r.json()["error"]["message"]
    assert client.completions.create(model="tiny", prompt=PROMPT, max_tokens=2).choices
