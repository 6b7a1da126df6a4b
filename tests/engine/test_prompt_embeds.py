"""Prompts given as embeddings (vLLM's prompt_embeds, --enable-prompt-embeds): the engine's
continuation equals transformers' `generate(inputs_embeds=...)` token for token and within
1e-4 in log-probability, for families whose embeddings are scaled, multiplied, positioned or
normalized at different points around where transformers takes them; batched with prompts of
tokens, chunked, prefix-cached by the rows' values, preempted, truncated and over two
tensor-parallel ranks; and what cannot run is refused naming prompt_embeds."""

from __future__ import annotations

import pytest
import torch
from falcon_h1_support import falcon_h1_config
from gemma4_support import gemma4_config
from model_support import hf_reference, make_random_model

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.bench.word_tokenizer import word_level_tokenizer
from tokenmill.engine.contract.config import ConfigError
from tokenmill.engine.core.errors import RequestError

VOCAB = 97
HIDDEN = 64
MAX_NEW = 8
ENGINE = dict(dtype="float32", enable_prompt_embeds=True, max_num_seqs=8,
              max_num_batched_tokens=16, block_size=8, show_progress=False)
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=0)


def _config(kind: str):
    import transformers

    layers = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=256, tie_word_embeddings=False)
    if kind == "gemma2":  # scaled inside transformers' embedding module, so before the rows
        return transformers.Gemma2Config(head_dim=16, **layers)
    if kind == "granite":  # multiplied after it, so after the rows too
        return transformers.GraniteConfig(embedding_multiplier=6.0, attention_multiplier=0.5,
                                          residual_multiplier=0.3, logits_scaling=4.0, **layers)
    if kind == "falcon_h1":  # multiplied only where it looks tokens up: not the rows
        return falcon_h1_config(VOCAB, embedding_multiplier=6.0)
    if kind == "opt":  # learned positions added after
        return transformers.OPTConfig(vocab_size=VOCAB, hidden_size=HIDDEN, ffn_dim=128,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      max_position_embeddings=256, word_embed_proj_dim=HIDDEN)
    if kind == "bloom":  # normalized after
        return transformers.BloomConfig(vocab_size=VOCAB, hidden_size=HIDDEN, n_layer=2,
                                        n_head=4)
    return transformers.LlamaConfig(**layers)


def _rows(hf, ids: list[int], seed: int) -> torch.Tensor:
    """The model's embeddings of `ids`, moved off any token's: the engine must use them, not
    the placeholder tokens' embeddings, nor the tokens'."""
    noise = torch.randn(len(ids), HIDDEN, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return hf.get_input_embeddings()(torch.tensor([ids]))[0] + 0.3 * noise


def _hf_continuation(hf, prompt: torch.Tensor | list[int],
                     max_new: int = MAX_NEW) -> tuple[list[int], list[float]]:
    """transformers' greedy continuation of rows (taken as inputs_embeds) or of token ids,
    each next token read by id through the model's cache, and each token's log-probability."""
    tokens, logprobs = [], []
    first = {"input_ids": torch.tensor([prompt])} if isinstance(prompt, list) else \
        {"inputs_embeds": prompt[None]}
    with torch.no_grad():
        out = hf(**first, use_cache=True)
        for _ in range(max_new):
            scores = out.logits[0, -1].log_softmax(-1)
            tokens.append(int(scores.argmax()))
            logprobs.append(scores[tokens[-1]].item())
            out = hf(input_ids=torch.tensor([tokens[-1:]]), cache=out.past_key_values,
                     use_cache=True)
    return tokens, logprobs


def _checkpoint(tmp_path_factory, kind: str) -> str:
    return make_random_model(str(tmp_path_factory.mktemp(kind)), _config(kind),
                             word_level_tokenizer(VOCAB))


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    directory = _checkpoint(tmp_path_factory, "llama")
    return directory, hf_reference(directory)


def _prompts(hf) -> list[torch.Tensor]:
    """Three prompts of 5, 19 and 37 rows (the last three steps of 16 tokens)."""
    gen = torch.Generator().manual_seed(7)
    return [_rows(hf, torch.randint(3, VOCAB, (n,), generator=gen).tolist(), n)
            for n in (5, 19, 37)]


def _continuation(out) -> tuple[list[int], list[float]]:
    c = out.outputs[0]
    return c.token_ids, [entry[t] for t, entry in zip(c.token_ids, c.logprobs, strict=True)]


def _assert_equal(got: tuple[list[int], list[float]], want: tuple[list[int], list[float]]):
    assert got[0] == want[0]
    assert got[1] == pytest.approx(want[1], abs=1e-4)


@pytest.mark.parametrize("kind", ["llama", "gemma2", "granite", "falcon_h1", "opt", "bloom"])
def test_greedy_from_embeddings_equals_transformers(kind, tmp_path_factory):
    """Beside a prompt of tokens, in chunks of 16; then again, every block of the rows found
    in the prefix cache."""
    directory = _checkpoint(tmp_path_factory, kind)
    hf = hf_reference(directory)
    prompts = _prompts(hf)
    want = [_hf_continuation(hf, rows) for rows in prompts]
    tokens = [5, 9, 14, 3, 22, 40, 41]
    with LLM(directory, **ENGINE) as llm:
        first = llm.generate([{"prompt_embeds": rows} for rows in prompts] + [tokens], GREEDY)
        again = llm.generate([{"prompt_embeds": rows} for rows in prompts], GREEDY)
        llm.engine.kv.allocator.check_all_free()
    for out, expected in zip(first[:3] + again, want + want, strict=True):
        _assert_equal(_continuation(out), expected)
    _assert_equal(_continuation(first[3]), _hf_continuation(hf, tokens))
    assert [out.num_cached_tokens for out in again] == [0, 16, 32]  # whole blocks of 8
    assert first[0].prompt_token_ids is None and first[0].num_prompt_tokens == 5


def test_the_prefix_cache_keys_rows_by_their_values(llama):
    """Rows equal from the first share cached blocks, as tokens do; the same rows from
    another first row share none, nor do the placeholder tokens the rows stand on."""
    directory, hf = llama
    rows = _prompts(hf)[2]
    moved = rows.clone()
    moved[0] += 1.0
    with LLM(directory, **ENGINE) as llm:
        llm.generate([{"prompt_embeds": rows}], GREEDY)
        longer = torch.cat([rows, rows[:5]])
        cached = [llm.generate([prompt], GREEDY)[0].num_cached_tokens for prompt in
                  ({"prompt_embeds": longer}, {"prompt_embeds": moved}, [0] * len(rows))]
        # The placeholder tokens' own prompt is computed, and its continuation is theirs.
        placeholders = llm.generate([[0] * len(rows)], GREEDY)[0]
    assert cached == [32, 0, 0]
    _assert_equal(_continuation(placeholders), _hf_continuation(hf, [0] * len(rows)))


def test_preempted_requests_compute_their_rows_again(llama):
    """A pool of six blocks for three prompts of up to five: sequences are preempted and
    resume by computing their prompts' rows again; n = 2 forks share the rows."""
    directory, hf = llama
    prompts = _prompts(hf)
    want = [_hf_continuation(hf, rows, 12) for rows in prompts]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=0, n=2)
    with LLM(directory, **dict(ENGINE, num_gpu_blocks_override=9,
                               enable_prefix_caching=False)) as llm:
        outs = llm.generate([{"prompt_embeds": rows} for rows in prompts], params)
        assert llm.engine.scheduler.num_preemptions > 0
    for out, expected in zip(outs, want, strict=True):
        for c in out.outputs:
            assert c.token_ids == expected[0]


def test_penalties_count_only_generated_tokens(llama):
    """A prompt given as embeddings has no tokens: repetition_penalty covers the output alone,
    as transformers' generate from inputs_embeds applies it (the processed log-probabilities
    show a penalty on any other token, the placeholders' too)."""
    directory, hf = llama
    rows = _prompts(hf)[1]
    with torch.no_grad():
        out = hf.generate(inputs_embeds=rows[None], max_new_tokens=12, do_sample=False,
                          repetition_penalty=1.8, pad_token_id=0, output_scores=True,
                          return_dict_in_generate=True)
    want = out.sequences[0].tolist()
    want_logprobs = [scores[0].log_softmax(-1)[t].item()
                     for scores, t in zip(out.scores, want, strict=True)]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=0,
                            repetition_penalty=1.8)
    with LLM(directory, **dict(ENGINE, logprobs_mode="processed_logprobs")) as llm:
        got = _continuation(llm.generate([{"prompt_embeds": rows}], params)[0])
    _assert_equal(got, (want, want_logprobs))


def test_truncation_keeps_the_last_rows(llama):
    directory, hf = llama
    rows = _prompts(hf)[2]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=0,
                            truncate_prompt_tokens=11)
    with LLM(directory, **ENGINE) as llm:
        out = llm.generate([{"prompt_embeds": rows}], params)[0]
    assert out.num_prompt_tokens == 11
    _assert_equal(_continuation(out), _hf_continuation(hf, rows[-11:]))


def test_rows_reach_every_tensor_parallel_rank(llama):
    directory, hf = llama
    prompts = _prompts(hf)
    with LLM(directory, tensor_parallel_size=2, **ENGINE) as llm:
        outs = llm.generate([{"prompt_embeds": rows} for rows in prompts], GREEDY)
    for out, rows in zip(outs, prompts, strict=True):
        _assert_equal(_continuation(out), _hf_continuation(hf, rows))


def test_what_cannot_run_is_refused_naming_prompt_embeds(llama):
    directory, hf = llama
    rows = _prompts(hf)[0]
    with LLM(directory, **dict(ENGINE, enable_prompt_embeds=False)) as llm:
        with pytest.raises(RequestError, match="--enable-prompt-embeds") as refused:
            llm.generate([{"prompt_embeds": rows}], GREEDY)
        assert refused.value.param == "prompt_embeds"
    bad = {
        "shape [tokens, 64]": rows[:, :32],
        "at least one token": rows[:0],
        "floating-point": rows.long(),
        "not finite": torch.where(torch.arange(HIDDEN) == 3, float("nan"), rows),
        "dense": rows.to_sparse(),
        "must be a tensor": rows.tolist(),
    }
    with LLM(directory, **dict(ENGINE, max_model_len=40)) as llm:
        for words, value in bad.items():
            with pytest.raises(RequestError, match=words.replace("[", r"\[")) as refused:
                llm.generate([{"prompt_embeds": value}], GREEDY)
            assert refused.value.param == "prompt_embeds", words
        with pytest.raises(RequestError, match="no tokens to score"):
            llm.generate([{"prompt_embeds": rows}], SamplingParams(prompt_logprobs=1))
        with pytest.raises(RequestError, match="40"):  # 37 rows and 8 new tokens
            llm.generate([{"prompt_embeds": _prompts(hf)[2]}], GREEDY)
        with pytest.raises(ValueError, match="nothing beside"):
            llm.generate([{"prompt_embeds": rows, "prompt": "x"}], GREEDY)
        # Nothing was queued, and the engine still serves.
        assert llm.generate([{"prompt_embeds": rows}], GREEDY)[0].outputs[0].token_ids


def test_a_model_reading_per_layer_inputs_refuses_at_start(tmp_path):
    """Gemma 4's per-layer inputs are looked up by token id: --enable-prompt-embeds is refused
    before any weight loads."""
    config = gemma4_config(VOCAB, hidden_size_per_layer_input=8, vocab_size_per_layer_input=VOCAB)
    directory = tmp_path / "gemma4"
    directory.mkdir()
    config.save_pretrained(directory)
    word_level_tokenizer(VOCAB).save_pretrained(directory)
    with pytest.raises(ConfigError, match="enable_prompt_embeds: .*per-layer inputs"):
        LLM(str(directory), **ENGINE)
