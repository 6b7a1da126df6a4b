"""Echo with logprobs and vLLM's prompt_logprobs through /v1/completions (and on a chat), driven
by the official `openai` client, checked against Hugging Face's forward pass on a tiny random
model."""

from __future__ import annotations

import httpx
import openai
import pytest
import torch
from server_support import in_process_server

from tokenmill.engine.server.state import ServerState
from tokenmill.engine.server.text_offsets import prompt_offsets

MODEL = "tiny"
PROMPT = "The quick brown fox jumps over the lazy dog because"
TOL = 1e-4


@pytest.fixture(scope="module")
def server(tiny_llama_dir):
    """In place of SmolLM2: the tiny random model, whose HF forward pass is the reference."""
    with in_process_server(tiny_llama_dir, MODEL, max_num_batched_tokens=256) as server:
        yield server


@pytest.fixture(scope="module")
def reference(tiny_llama_dir, server_state):
    """The prompt's ids and HF's [len - 1, vocab] logprobs of each next prompt token."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    ids = server_state.tokenizer.encode(PROMPT)
    with torch.no_grad():
        logits = hf(torch.tensor([ids])).logits[0, :-1]
    return ids, torch.log_softmax(logits.float(), dim=-1)


def _piece(state: ServerState, token: int) -> str:
    return state.tokenizer.decode([token], skip_special_tokens=False)


def test_echo_with_logprobs_scores_the_prompt_then_the_completion(client, server_state,
                                                                  reference):
    ids, ref = reference
    prompt_len = len(ids)
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0,
                                  logprobs=3, echo=True)
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0,
                                      logprobs=3)
    choice, lp = r.choices[0], r.choices[0].logprobs
    assert choice.text == PROMPT + plain.choices[0].text
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == prompt_len + 4
    assert lp.tokens[:prompt_len] == [_piece(server_state, t) for t in ids]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    for p in range(1, prompt_len):
        row = ref[p - 1]
        assert abs(lp.token_logprobs[p] - row[ids[p]].item()) < TOL
        top = row.topk(3)
        shown = lp.top_logprobs[p]
        assert sorted(shown.values(), reverse=True) == pytest.approx(top.values.tolist(),
                                                                     abs=TOL)
        assert set(shown) == {_piece(server_state, t) for t in top.indices.tolist()}
    # The completion's part is what the same request without echo returns.
    assert lp.tokens[prompt_len:] == plain.choices[0].logprobs.tokens
    assert lp.token_logprobs[prompt_len:] == pytest.approx(
        plain.choices[0].logprobs.token_logprobs, abs=TOL)
    # Offsets count from the start of the returned text: the prompt's tokens from 0, the
    # completion's from the end of the echoed prompt.
    offsets = lp.text_offset
    assert offsets[0] == 0 and offsets == sorted(offsets)
    assert offsets[prompt_len:] == [len(PROMPT) + o for o in plain.choices[0].logprobs.text_offset]


def test_echo_with_max_tokens_0_is_the_prompt_alone_scored(client, server_state, reference):
    """As evaluation harnesses score a text (OpenAI's legacy completions and vLLM answer it):
    the prompt, each token after the first scored, nothing generated, whole or streamed."""
    ids, ref = reference
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0, temperature=0,
                                  logprobs=1, echo=True)
    choice = r.choices[0]
    assert choice.text == PROMPT and choice.finish_reason == "length"
    assert choice.logprobs.tokens == [_piece(server_state, t) for t in ids]
    assert choice.logprobs.token_logprobs[0] is None
    for p in range(1, len(ids)):
        assert abs(choice.logprobs.token_logprobs[p] - ref[p - 1][ids[p]].item()) < TOL
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ids), 0)
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0,
                                            echo=True, stream=True,
                                            stream_options={"include_usage": True}))
    choices = [c.choices[0] for c in chunks if c.choices]
    assert "".join(c.text for c in choices) == PROMPT
    assert choices[-1].finish_reason == "length" and chunks[-1].usage.completion_tokens == 0
    with pytest.raises(openai.BadRequestError, match="only with echo") as refused:
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0)
    assert refused.value.body["param"] == "max_tokens"


def test_prompt_logprobs_field_is_vllms(client, server_state, reference):
    ids, ref = reference
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, temperature=0,
                                  extra_body={"prompt_logprobs": 2})
    choice = r.choices[0]
    assert choice.logprobs is None and choice.text  # nothing else changes
    scores = choice.model_extra["prompt_logprobs"]
    assert len(scores) == len(ids) and scores[0] is None
    for p in range(1, len(ids)):
        row, token = ref[p - 1], ids[p]
        entry = scores[p]
        top = row.topk(2).indices.tolist()
        assert set(entry) == {str(t) for t in [*top, token]}
        for t, info in entry.items():
            assert abs(info["logprob"] - row[int(t)].item()) < TOL
            assert info["decoded_token"] == _piece(server_state, int(t))
        mine = entry[str(token)]
        value = row[token]
        assert int((row > value + TOL).sum()) + 1 <= mine["rank"] <= (
            int((row > value - TOL).sum()) + 1)
        for rank, t in enumerate(top, start=1):
            if t != token:
                assert entry[str(t)]["rank"] == rank


def test_a_chat_reply_carries_its_rendered_prompts_scores(client, server_state, tiny_llama_dir):
    """vLLM's prompt_logprobs on a chat: once, top-level, over the template's tokens; refused
    on a stream, as vLLM refuses it."""
    from transformers import AutoModelForCausalLM

    messages = [{"role": "user", "content": PROMPT}]
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2,
                                       extra_body={"prompt_logprobs": 1,
                                                   "return_token_ids": True})
    ids = r.model_extra["prompt_token_ids"]
    scores = r.model_extra["prompt_logprobs"]
    assert len(scores) == len(ids) == r.usage.prompt_tokens and scores[0] is None
    hf = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0, :-1].float(), dim=-1)
    for p in range(1, len(ids)):
        entry = scores[p]
        assert str(ids[p]) in entry and len(entry) <= 2
        assert abs(entry[str(ids[p])]["logprob"] - ref[p - 1, ids[p]].item()) < TOL
    with pytest.raises(openai.BadRequestError, match="prompt_logprobs"):
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2,
                                       stream=True, extra_body={"prompt_logprobs": 1})


def test_prompt_logprobs_zero_is_the_prompt_token_alone(client, reference):
    ids, _ = reference
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=1, temperature=0,
                                  extra_body={"prompt_logprobs": 0})
    scores = r.choices[0].model_extra["prompt_logprobs"]
    assert [list(e) if e else e for e in scores] == [None] + [[str(t)] for t in ids[1:]]


def test_streamed_echo_logprobs_equal_the_full_response(client):
    kwargs = dict(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=2,
                  echo=True)
    full = client.completions.create(**kwargs).choices[0]
    text, tokens, values, offsets, prompt_scores = "", [], [], [], []
    for chunk in client.completions.create(stream=True, **kwargs,
                                           extra_body={"prompt_logprobs": 1}):
        for c in chunk.choices:
            text += c.text
            if c.logprobs:
                tokens += c.logprobs.tokens
                values += c.logprobs.token_logprobs
                offsets += c.logprobs.text_offset
            prompt_scores.append((c.model_extra or {}).get("prompt_logprobs"))
    assert text == full.text
    assert tokens == full.logprobs.tokens and offsets == full.logprobs.text_offset
    assert values[0] is None and full.logprobs.token_logprobs[0] is None
    assert values[1:] == pytest.approx(full.logprobs.token_logprobs[1:], abs=TOL)
    assert prompt_scores[0] is not None and not any(prompt_scores[1:])  # the first chunk's


def test_every_prompt_and_choice_gets_its_own_prompts_scores(client, server_state):
    prompts = [PROMPT, "Another prompt, longer than the first one by a few words at least"]
    r = client.completions.create(model=MODEL, prompt=prompts, max_tokens=3, n=2,
                                  temperature=0.8, seed=1, logprobs=0, echo=True)
    assert len(r.choices) == 4
    for choice in r.choices:
        prompt = prompts[choice.index // 2]
        ids = server_state.tokenizer.encode(prompt)
        assert choice.text.startswith(prompt)
        assert choice.logprobs.tokens[:len(ids)] == [_piece(server_state, t) for t in ids]
        assert choice.logprobs.token_logprobs[0] is None
        assert all(v is not None for v in choice.logprobs.token_logprobs[1:])
        assert all(top == {} for top in choice.logprobs.top_logprobs[1:])  # logprobs=0
    first = [c.logprobs.token_logprobs[:10] for c in r.choices[:2]]
    assert first[0] == first[1]  # one prompt, one scoring


@pytest.mark.parametrize("body", [
    {"prompt_logprobs": 21}, {"prompt_logprobs": -1}, {"prompt_logprobs": 1.5},
])
def test_bad_prompt_logprobs_are_400(client, body):
    r = httpx.post(f"{client.base_url}completions",
                   json={"model": MODEL, "prompt": "x", "max_tokens": 1, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_logprobs_name_tokens_by_id_when_asked(server, server_state):
    """vLLM's return_tokens_as_token_ids, per request or by the server's flag: each token
    "token_id:ID", the same ids greedy decoding picks, and text offsets into the text as
    before."""
    client = server.client
    ask = {"model": MODEL, "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 3}
    plain = client.completions.create(**ask).choices[0]
    by_id = client.completions.create(
        **ask, extra_body={"return_tokens_as_token_ids": True}).choices[0]
    ids = [int(t.removeprefix("token_id:")) for t in by_id.logprobs.tokens]
    assert all(t.startswith("token_id:") for t in by_id.logprobs.tokens)
    assert [_piece(server_state, i) for i in ids] == plain.logprobs.tokens
    assert by_id.text == plain.text and by_id.logprobs.text_offset == plain.logprobs.text_offset
    assert by_id.logprobs.token_logprobs == plain.logprobs.token_logprobs
    for token, top in zip(by_id.logprobs.tokens, by_id.logprobs.top_logprobs, strict=True):
        assert max(top, key=top.get) == token  # greedy: the chosen token is the likeliest
    chat = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4,
            "temperature": 0, "logprobs": True, "top_logprobs": 2}
    server_state.options.return_tokens_as_token_ids = True
    try:
        flagged = client.chat.completions.create(**chat).choices[0].logprobs.content
        overridden = client.chat.completions.create(
            **chat, extra_body={"return_tokens_as_token_ids": False}).choices[0].logprobs.content
    finally:
        server_state.options.return_tokens_as_token_ids = False
    assert [_piece(server_state, int(c.token.removeprefix("token_id:"))) for c in flagged] == [
        c.token for c in overridden]
    assert all(c.bytes == list(c.token.encode()) for c in flagged)
    assert all(t.token.startswith("token_id:") for c in flagged for t in c.top_logprobs)


def _offsets_fit(text: str, tokens: list[str], offsets: list[int]) -> None:
    """Each token whose text is whole sits at its offset; one that holds part of a character
    (U+FFFD) begins at or before that character."""
    assert offsets == sorted(offsets)
    for token, offset in zip(tokens, offsets, strict=True):
        if "\ufffd" not in token:
            assert text[offset:offset + len(token)] == token, (token, offset, text)


def test_offsets_stay_on_the_text_past_characters_split_over_tokens(client):
    """An emoji is two tokens here, each decoding to U+FFFD: adding up the tokens' own
    lengths put every later token one place off."""
    kwargs = dict(model=MODEL, prompt="I love 😀 and café, très bien", max_tokens=24,
                  temperature=0, logprobs=1, echo=True, stop=["\n\n\n"])
    full = client.completions.create(**kwargs).choices[0]
    assert any("\ufffd" in t for t in full.logprobs.tokens)
    _offsets_fit(full.text, full.logprobs.tokens, full.logprobs.text_offset)
    assert full.logprobs.text_offset[full.logprobs.tokens.index(" and")] == 8
    text, tokens, offsets = "", [], []
    for chunk in client.completions.create(stream=True, **kwargs):
        for c in chunk.choices:
            text += c.text
            tokens += c.logprobs.tokens if c.logprobs else []
            offsets += c.logprobs.text_offset if c.logprobs else []
    assert (text, tokens, offsets) == (full.text, full.logprobs.tokens,
                                       full.logprobs.text_offset)


def test_a_token_the_prompt_text_does_not_hold_takes_no_room(server_state):
    """A special token the tokenizer put before the text (a BOS) has no place in it; one the
    text holds takes its length."""
    tokenizer = server_state.tokenizer
    special = tokenizer.eos_token
    ids = [tokenizer.eos_token_id, *tokenizer.encode("Hi 😀 there")]
    assert prompt_offsets(tokenizer, ids, "Hi 😀 there")[:2] == [0, 0]
    written = prompt_offsets(tokenizer, ids, special + "Hi 😀 there")
    assert written[:2] == [0, len(special)]
    assert written[-1] == len(special + "Hi 😀")


def test_chat_logprobs_bytes_join_into_a_character_split_over_tokens(client):
    """Each part of an emoji decodes to U+FFFD; its `bytes` are its own, so the parts join
    into the emoji (what OpenAI's field is for), and a whole token's are its text's."""
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Smile."}], max_tokens=12,
        temperature=0, logprobs=True, top_logprobs=2,
        extra_body={"structured_outputs": {"choice": ["Yes 😀 café"]}})
    choice = reply.choices[0]
    content = choice.logprobs.content
    assert choice.message.content == "Yes 😀 café"
    assert any(c.token == "\ufffd" for c in content)
    joined = bytes(b for c in content for b in c.bytes).decode()
    assert joined in ("Yes 😀 café", "Yes 😀 café" + content[-1].token)  # the EOS scored too
    for entry in [*content, *(top for c in content for top in c.top_logprobs)]:
        if "\ufffd" not in entry.token:
            assert entry.bytes == list(entry.token.encode())
