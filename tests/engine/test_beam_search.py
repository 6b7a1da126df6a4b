"""LLM.beam_search equals transformers' beam search (`generate(num_beams=...)`) token for token:
on a random model whose small vocabulary puts its end token among the candidates often (so
beams end at every length), under each early_stopping mode and length penalty, with
min_tokens, ignore_eos and extra end tokens; and on SmolLM2's chat replies, which end."""

from __future__ import annotations

import pytest
import torch
from model_support import make_random_model
from safetensors.torch import load_file, save_file

from tokenmill.engine import LLM, BeamSearchParams
from tokenmill.engine.bench.word_tokenizer import word_level_tokenizer
from tokenmill.engine.core import BeamSearch
from tokenmill.engine.core.errors import RequestError

EOS = 2
FAVOURED = 9  # the token the random model below ranks first most often
VOCAB = 12  # the end token is among a beam's few best candidates often


@pytest.fixture(scope="module")
def small_vocab_dir(tmp_path_factory) -> str:
    from transformers import LlamaConfig

    tokenizer = word_level_tokenizer(VOCAB)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, tie_word_embeddings=False,
                         bos_token_id=1, eos_token_id=EOS)
    directory = make_random_model(str(tmp_path_factory.mktemp("small-vocab")), config,
                                  tokenizer)
    # The end token's LM-head row near the most favoured token's, so the end is a close
    # second at many steps: beams end at many lengths, as a chat model's do.
    weights = load_file(f"{directory}/model.safetensors")
    head = weights["lm_head.weight"]
    head[EOS] = 0.97 * head[FAVOURED] + 0.03 * head[EOS]
    save_file(weights, f"{directory}/model.safetensors", metadata={"format": "pt"})
    return directory


@pytest.fixture(scope="module")
def small_vocab(small_vocab_dir):
    from transformers import AutoModelForCausalLM

    engine = LLM(small_vocab_dir, show_progress=False, dtype="float32", max_model_len=256,
                 max_logprobs=VOCAB)
    reference = AutoModelForCausalLM.from_pretrained(small_vocab_dir,
                                                     dtype=torch.float32).eval()
    yield engine, reference
    engine.shutdown()


def hf_beam_search(model, prompt: list[int], params: BeamSearchParams,
                   eos: list[int] | None) -> tuple[list[list[int]], list[float]]:
    """transformers' hypotheses (generated tokens, padding cut) and their scores."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False,
            num_beams=params.beam_width, num_return_sequences=params.beam_width,
            max_new_tokens=params.max_tokens, min_new_tokens=params.min_tokens or None,
            length_penalty=params.length_penalty, early_stopping=params.early_stopping,
            eos_token_id=eos, pad_token_id=EOS if eos else None,
            output_scores=True, return_dict_in_generate=True)
    lengths = (out.beam_indices >= 0).sum(dim=1).tolist()
    rows = [row[len(prompt):len(prompt) + n].tolist()
            for row, n in zip(out.sequences, lengths, strict=True)]
    return rows, out.sequences_scores.tolist()


CASES = [  # (params, the end tokens transformers is given)
    (BeamSearchParams(beam_width=3, max_tokens=12), [EOS]),
    (BeamSearchParams(beam_width=2, max_tokens=12, length_penalty=0.0,
                      early_stopping="never"), [EOS]),
    (BeamSearchParams(beam_width=4, max_tokens=10, length_penalty=0.5,
                      early_stopping=True), [EOS]),
    (BeamSearchParams(beam_width=3, max_tokens=12, length_penalty=-1.0, min_tokens=4), [EOS]),
    (BeamSearchParams(beam_width=2, max_tokens=8, ignore_eos=True), None),
    (BeamSearchParams(beam_width=3, max_tokens=12, early_stopping="never",
                      stop_token_ids=(5, 7)), [EOS, 5, 7]),
]


@pytest.mark.parametrize("params,eos", CASES,
                         ids=["default", "never-lp0", "early-lp0.5", "min-tokens-lp-1",
                              "ignore-eos", "stop-token-ids"])
def test_hypotheses_equal_transformers(small_vocab, params, eos):
    engine, reference = small_vocab
    prompts = [[1, 9, 4, 11], [1, 10], [1, 5, 6, 7, 8, 9, 10, 11, 3, 4, 6, 8, 4]]
    outputs = engine.beam_search(prompts, params)
    reasons = set()
    for prompt, output in zip(prompts, outputs, strict=True):
        want, scores = hf_beam_search(reference, prompt, params, eos)
        got = [seq.tokens[len(prompt):] for seq in output.sequences]
        assert got == want
        for seq, score in zip(output.sequences, scores, strict=True):
            generated = seq.tokens[len(prompt):]
            assert seq.tokens[:len(prompt)] == prompt
            assert len(seq.logprobs) == len(generated)
            assert seq.cum_logprob == pytest.approx(
                sum(entry[t] for entry, t in zip(seq.logprobs, generated, strict=True)))
            assert seq.cum_logprob / len(generated) ** params.length_penalty == \
                pytest.approx(score, abs=1e-4)
            ended = generated[-1] in (eos or [])
            assert seq.finish_reason == ("stop" if ended else "length")
            assert seq.stop_reason == (generated[-1] if ended and generated[-1] != EOS
                                       else None)
            assert len(generated) >= params.min_tokens
            reasons.add(seq.finish_reason)
    if eos:
        assert "stop" in reasons  # the end tokens did end beams: that path was compared


def test_smollm2_chat_hypotheses_equal_transformers(smol_llm, smol_hf, smol_tokenizer):
    prompts = [smol_tokenizer.encode(smol_tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False))
        for question in ("What is the capital of France?",)]
    params = BeamSearchParams(beam_width=3, max_tokens=24)
    outputs = smol_llm.beam_search(prompts, params)
    for prompt, output in zip(prompts, outputs, strict=True):
        want, _ = hf_beam_search(smol_hf, prompt, params, [smol_tokenizer.eos_token_id])
        assert [seq.tokens[len(prompt):] for seq in output.sequences] == want
    best = outputs[0].sequences[0]
    assert best.finish_reason == "stop"
    assert best.text == smol_tokenizer.decode(best.tokens)  # as vLLM's: the prompt included
    assert best.text.endswith("The capital of France is Paris.<|im_end|>")


def test_prompts_as_text_and_dicts_give_the_same_search(small_vocab):
    engine, _ = small_vocab
    params = BeamSearchParams(beam_width=2, max_tokens=6)
    ids = engine.tokenizer.encode("w9 w4 w11")
    by_text, by_dict, by_ids = engine.beam_search(
        ["w9 w4 w11", {"prompt_token_ids": ids}, ids], params)
    for one in (by_dict, by_ids):
        assert [s.tokens for s in one.sequences] == [s.tokens for s in by_text.sequences]
        assert [s.text for s in one.sequences] == [s.text for s in by_text.sequences]
    assert by_text.sequences[0].tokens[:len(ids)] == ids


def test_a_search_that_cannot_run_is_refused_before_any_runs(small_vocab, tiny_llama):
    engine, _ = small_vocab
    with pytest.raises(RequestError, match=r"maximum context length|256"):
        engine.beam_search([[1, 2, 3], [1] * 250], BeamSearchParams(beam_width=2,
                                                                     max_tokens=10))
    # tiny_llama keeps the default --max-logprobs (20): width 20 ranks 20 + its end tokens.
    ranked = 20 + len(tiny_llama.engine.eos_token_ids)
    with pytest.raises(RequestError, match=f"beam_width: a beam search of width 20 ranks the "
                                           f"top {ranked} log-probabilities of each token, more "
                                           f"than the 20 --max-logprobs allows"):
        tiny_llama.beam_search([[1, 2, 3]], BeamSearchParams(beam_width=20, max_tokens=4))
    assert not engine.engine.has_unfinished_requests()
    assert not tiny_llama.engine.has_unfinished_requests()


def test_an_engine_whose_logprobs_report_logits_refuses_beam_search(small_vocab_dir):
    with LLM(small_vocab_dir, show_progress=False, logprobs_mode="raw_logits") as llm, \
            pytest.raises(RequestError, match="beam search ranks log-probabilities, and this "
                                              "engine's logprobs report logits"):
        llm.beam_search([[1, 2, 3]], BeamSearchParams(beam_width=2, max_tokens=4))


@pytest.mark.parametrize("fields,message", [
    ({"beam_width": 0}, "n: beam search needs a beam width of at least 1"),
    ({"max_tokens": 0}, "max_tokens: must be at least 1"),
    ({"min_tokens": 9}, r"min_tokens: must be in \[0, max_tokens\]"),
    ({"early_stopping": "sometimes"}, "early_stopping: must be true, false or \"never\""),
])
def test_bad_params_name_their_field(fields, message):
    with pytest.raises(ValueError, match=message):
        BeamSearchParams(**{"beam_width": 2, "max_tokens": 8, **fields})


def test_the_search_checks_it_is_given_one_entry_per_beam():
    search = BeamSearch(BeamSearchParams(beam_width=2, max_tokens=4), {EOS})
    with pytest.raises(ValueError, match="2 log-probability sets for 1 running beams"):
        search.advance([{3: -0.1}, {3: -0.1}])
    with pytest.raises(RuntimeError, match="has not ended"):
        search.best()

