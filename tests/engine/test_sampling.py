"""Sampling per request: seeds, greedy equivalences, penalties, stops, n > 1, logprobs."""

from __future__ import annotations

import math

import pytest

from tokenmill.engine import SamplingParams

PROMPT = [312, 1040, 2203, 77, 4511]


def _tokens(llm, params, prompt=PROMPT):
    return [c.token_ids for c in llm.generate([prompt], params)[0].outputs]


def test_seeded_request_reproduces_whatever_the_batch(tiny_llama):
    params = SamplingParams(temperature=1.0, seed=1234, max_tokens=20, ignore_eos=True)
    alone = _tokens(tiny_llama, params)
    others = [SamplingParams(temperature=0.9, max_tokens=n, ignore_eos=True) for n in (3, 30)]
    batch = tiny_llama.generate([[9, 8, 7], PROMPT, [1000] * 40],
                                [others[0], params, others[1]])
    assert batch[1].outputs[0].token_ids == alone[0]
    different_seed = _tokens(tiny_llama, SamplingParams(temperature=1.0, seed=99, max_tokens=20,
                                                        ignore_eos=True))
    assert different_seed != alone


def test_temperature_zero_and_top_k_one_equal_greedy(tiny_llama):
    greedy = _tokens(tiny_llama, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))
    top_k_1 = _tokens(tiny_llama, SamplingParams(temperature=1.3, top_k=1, seed=5, max_tokens=16,
                                                 ignore_eos=True))
    tiny_top_p = _tokens(tiny_llama, SamplingParams(temperature=1.0, top_p=1e-9, seed=5,
                                                    max_tokens=16, ignore_eos=True))
    assert top_k_1 == greedy
    assert tiny_top_p == greedy


def test_min_p_one_keeps_only_the_most_likely_token(tiny_llama):
    greedy = _tokens(tiny_llama, SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True))
    min_p = _tokens(tiny_llama, SamplingParams(temperature=1.0, min_p=1.0, seed=1, max_tokens=10,
                                               ignore_eos=True))
    assert min_p == greedy


def test_unseeded_sampling_varies(tiny_llama):
    params = SamplingParams(temperature=1.5, max_tokens=12, ignore_eos=True)
    assert _tokens(tiny_llama, params) != _tokens(tiny_llama, params)


def test_penalties_discourage_repeats(tiny_llama):
    base = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    plain = _tokens(tiny_llama, base)[0]
    penalized = _tokens(tiny_llama, SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True,
                                                   frequency_penalty=2.0, presence_penalty=2.0))[0]
    repetition = _tokens(tiny_llama, SamplingParams(temperature=0.0, max_tokens=40,
                                                    ignore_eos=True, repetition_penalty=5.0))[0]
    assert len(set(penalized)) > len(set(plain))
    assert len(set(repetition)) > len(set(plain))


def test_n_samples_are_independent_and_complete(tiny_llama):
    out = tiny_llama.generate([PROMPT], SamplingParams(n=3, temperature=1.0, seed=7,
                                                       max_tokens=8, ignore_eos=True))[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert all(len(c.token_ids) == 8 and c.finish_reason == "length" for c in out.outputs)
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1
    again = tiny_llama.generate([PROMPT], SamplingParams(n=3, temperature=1.0, seed=7,
                                                         max_tokens=8, ignore_eos=True))[0]
    assert [c.token_ids for c in again.outputs] == [c.token_ids for c in out.outputs]
    tiny_llama.engine.kv.allocator.check_all_free()


def test_logprobs_are_top_k_and_include_the_sampled_token(tiny_llama):
    out = tiny_llama.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=5,
                                                       logprobs=3, ignore_eos=True))[0].outputs[0]
    assert len(out.logprobs) == 5
    for token, entry in zip(out.token_ids, out.logprobs, strict=True):
        assert len(entry) == 3 and token in entry
        values = list(entry.values())
        assert values == sorted(values, reverse=True) and all(v <= 0 for v in values)
        assert entry[token] == max(values)  # greedy picks the most likely token
        assert sum(math.exp(v) for v in values) <= 1.0 + 1e-5


def test_logprobs_are_the_models_own_whatever_the_sampling(tiny_llama, tiny_llama_dir):
    """vLLM's default logprobs mode (raw_logprobs, the only one served): a temperature, a
    bias, a penalty and top-k change which tokens are drawn, not the logprobs reported."""
    import torch
    from transformers import AutoModelForCausalLM

    params = SamplingParams(temperature=0.4, top_k=5, seed=3, max_tokens=6, logprobs=2,
                            ignore_eos=True, presence_penalty=1.5, logit_bias={1040: 4.0})
    out = tiny_llama.generate([PROMPT], params)[0].outputs[0]
    hf = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = hf(torch.tensor([PROMPT + out.token_ids])).logits[0, len(PROMPT) - 1:-1]
    expected = torch.log_softmax(logits.float(), dim=-1)
    for row, token, entry in zip(expected, out.token_ids, out.logprobs, strict=True):
        assert entry[token] == pytest.approx(row[token].item(), abs=1e-4)
        best = row.topk(2)
        assert [entry[t] for t in best.indices.tolist()] == pytest.approx(
            best.values.tolist(), abs=1e-4)


def test_stop_token_ids_end_the_output(tiny_llama):
    full = _tokens(tiny_llama, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))[0]
    stop_at = full[4]
    out = tiny_llama.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=12,
                                                       stop_token_ids=[stop_at],
                                                       ignore_eos=True))[0].outputs[0]
    first = full.index(stop_at)
    assert out.token_ids == full[:first + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop_at


@pytest.fixture(scope="module")
def paris_text(smol_llm):
    msg = [{"role": "user", "content": "What is the capital of France?"}]
    return smol_llm.chat(msg, SamplingParams(temperature=0.0, max_tokens=30))[0].outputs[0].text


@pytest.mark.parametrize("stop", ["Paris", "is P", " of", "."])
def test_stop_strings_cut_the_text_exactly(smol_llm, paris_text, stop):
    msg = [{"role": "user", "content": "What is the capital of France?"}]
    out = smol_llm.chat(msg, SamplingParams(temperature=0.0, max_tokens=30,
                                            stop=[stop, "never-appears"]))[0].outputs[0]
    assert out.text == paris_text[:paris_text.index(stop)]
    assert out.finish_reason == "stop" and out.stop_reason == stop


def test_eos_ends_with_stop_and_ignore_eos_runs_to_length(smol_llm):
    msg = [{"role": "user", "content": "What is the capital of France?"}]
    natural = smol_llm.chat(msg, SamplingParams(temperature=0.0, max_tokens=40))[0].outputs[0]
    assert natural.finish_reason == "stop" and len(natural.token_ids) < 40
    forced = smol_llm.chat(msg, SamplingParams(temperature=0.0, max_tokens=40,
                                               ignore_eos=True))[0].outputs[0]
    assert forced.finish_reason == "length" and len(forced.token_ids) == 40


PARIS = [{"role": "user", "content": "What is the capital of France?"}]


def test_min_tokens_equals_hf_min_new_tokens(smol_llm, smol_hf, smol_tokenizer):
    """vLLM's min_tokens is Hugging Face's min_new_tokens: EOS is masked until that many
    tokens are out. The answer ends by itself after 8 tokens; asked for 15 at least, greedy
    goes on exactly as the reference does."""
    import torch

    natural = smol_llm.chat(PARIS, SamplingParams(temperature=0.0, max_tokens=40))[0].outputs[0]
    assert natural.finish_reason == "stop" and len(natural.token_ids) < 15
    out = smol_llm.chat(PARIS, SamplingParams(temperature=0.0, max_tokens=30,
                                              min_tokens=15))[0].outputs[0]
    prompt = smol_tokenizer.apply_chat_template(PARIS, add_generation_prompt=True,
                                                tokenize=True, return_dict=False)
    ids = torch.tensor([prompt])
    with torch.no_grad():
        reference = smol_hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                     min_new_tokens=15, max_new_tokens=30, pad_token_id=0)
    assert out.token_ids == reference[0, len(prompt):].tolist()
    assert len(out.token_ids) >= 15 and not set(out.token_ids[:15]) & smol_llm.engine.eos_token_ids
    assert out.token_ids[:len(natural.token_ids) - 1] == natural.token_ids[:-1]


def test_stop_token_ids_wait_for_min_tokens(tiny_llama):
    """A stop token is masked, not just ignored, until min_tokens are out: the first tokens
    are those of the same request with that token banned."""
    full = _tokens(tiny_llama, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))[0]
    stop_at = full[1]
    banned = _tokens(tiny_llama, SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True,
                                                logit_bias={stop_at: -100}))[0]
    out = tiny_llama.generate([PROMPT], SamplingParams(
        temperature=0.0, max_tokens=12, ignore_eos=True, stop_token_ids=[stop_at],
        min_tokens=5))[0].outputs[0]
    assert out.token_ids[:5] == banned and stop_at not in banned
    if out.finish_reason == "stop":
        assert out.token_ids[-1] == stop_at and out.token_ids.index(stop_at) >= 5


def test_stop_strings_wait_for_min_tokens_and_may_stay_in_the_text(smol_llm, paris_text):
    """include_stop_str_in_output keeps the stop string at the end of the text; under
    min_tokens a stop string in the first tokens is passed over."""
    kept = smol_llm.chat(PARIS, SamplingParams(temperature=0.0, max_tokens=30, stop=["."],
                                               include_stop_str_in_output=True))[0].outputs[0]
    assert kept.text == paris_text[:paris_text.index(".") + 1]
    assert kept.finish_reason == "stop" and kept.stop_reason == "."
    late = smol_llm.chat(PARIS, SamplingParams(temperature=0.0, max_tokens=40, stop=["."],
                                               min_tokens=12))[0].outputs[0]
    assert late.text.startswith(paris_text) and len(late.text) > len(paris_text)
    assert len(late.token_ids) > 12 and "." not in late.text[len(paris_text):]


def test_min_tokens_above_max_tokens_is_refused():
    from tokenmill.engine.core.sampling_params import SamplingParamsError

    with pytest.raises(SamplingParamsError, match="min_tokens"):
        SamplingParams(max_tokens=4, min_tokens=5)
    with pytest.raises(SamplingParamsError, match="min_tokens"):
        SamplingParams(min_tokens=-1)


def test_allowed_token_ids_restrict_every_token(tiny_llama):
    full = _tokens(tiny_llama, SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True))[0]
    # Allowing what greedy picks anyway (and more) changes nothing.
    wider = sorted(set(full) | {5, 6, 7})
    assert _tokens(tiny_llama, SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True,
                                              allowed_token_ids=wider))[0] == full
    pair = [t for t in range(100, 1000) if t not in full][:2]
    for params in (SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True,
                                  allowed_token_ids=pair),
                   SamplingParams(temperature=1.0, seed=3, max_tokens=10, ignore_eos=True,
                                  allowed_token_ids=pair)):
        assert set(_tokens(tiny_llama, params)[0]) <= set(pair)


def test_bad_words_are_never_generated(smol_llm, paris_text):
    """A one-token word is masked everywhere; a longer one only where the output already ends
    with its other tokens, so its first token may still appear."""
    def answer(words):
        return smol_llm.chat(PARIS, SamplingParams(temperature=0.0, max_tokens=30,
                                                   bad_words=words))[0].outputs[0].text

    assert paris_text.startswith("The capital of France is Paris")
    no_paris = answer(["Paris"])
    assert "Paris" not in no_paris and no_paris.startswith("The capital of France is")
    no_phrase = answer(["capital of"])
    assert "capital of" not in no_phrase and no_phrase.startswith("The capital")


def test_offline_chat_takes_vllms_keywords(tiny_llama):
    """LLM.chat's vLLM keywords: sampling_params, chat_template, add_generation_prompt,
    continue_final_message and chat_template_kwargs reach the template."""
    template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                "{% if add_generation_prompt %}assistant:{% if terse %} briefly{% endif %}"
                "{% endif %}")
    turns = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi, I"}]
    opened = tiny_llama.apply_chat_template(turns[:1], chat_template=template,
                                            chat_template_kwargs={"terse": True})
    assert tiny_llama.tokenizer.decode(opened).endswith("assistant: briefly")
    continued = tiny_llama.apply_chat_template(turns, chat_template=template,
                                               add_generation_prompt=False,
                                               continue_final_message=True)
    assert tiny_llama.tokenizer.decode(continued).endswith("Hi, I")
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    out = tiny_llama.chat(turns, sampling_params=params, chat_template=template,
                          add_generation_prompt=False, continue_final_message=True)[0]
    assert out.prompt_token_ids == continued
    assert out.outputs[0].token_ids == tiny_llama.generate(continued, sampling_params=params)[
        0].outputs[0].token_ids


def test_offline_chat_reads_openais_text_parts_on_a_template_of_strings(tiny_llama):
    """OpenAI's list of text parts renders as the joined text on a template that prints a
    string (as vLLM's chat_template_content_format "auto" gives it)."""
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hello"},
                                          {"type": "text", "text": "there"}]}]
    plain = [{"role": "user", "content": "Hello\nthere"}]
    [from_parts] = tiny_llama.chat(parts, sampling_params=params)
    [from_text] = tiny_llama.chat(plain, sampling_params=params)
    assert from_parts.prompt_token_ids == from_text.prompt_token_ids
    assert from_parts.outputs[0].token_ids == from_text.outputs[0].token_ids
    with pytest.raises(ValueError, match="chat_template_content_format: 'json'"):
        tiny_llama.chat(plain, chat_template_content_format="json")
