"""vLLM's --logprobs-mode: raw_logits report the model's logits; processed_logprobs and
processed_logits what the token was drawn from (logit_bias applied, then for a sampled row the
temperature and the top-k mask, ruled-out tokens at -inf), checked against Hugging Face's
logits; a greedy row's processed values take no temperature."""

from __future__ import annotations

import pytest
import torch

from tokenmill.engine import LLM, SamplingParams

PROMPT = [312, 1040, 2203, 77, 4511]
BIAS = {1040: 4.0}
SAMPLED = SamplingParams(temperature=0.5, top_k=3, seed=3, max_tokens=5, logprobs=4,
                         ignore_eos=True, logit_bias=BIAS)
GREEDY = SamplingParams(temperature=0.0, max_tokens=3, logprobs=2, ignore_eos=True,
                        logit_bias=BIAS)


@pytest.fixture(scope="module")
def hf(tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()


def _logits(hf, tokens: list[int]) -> torch.Tensor:
    """HF's logits at each generated position (the row each token was drawn from)."""
    with torch.no_grad():
        return hf(torch.tensor([PROMPT + tokens])).logits[0, len(PROMPT) - 1:-1].float()


def _biased(logits: torch.Tensor) -> torch.Tensor:
    out = logits.clone()
    for token, bias in BIAS.items():
        out[:, token] += bias
    return out


def _top_k_scaled(logits: torch.Tensor, k: int, temperature: float) -> torch.Tensor:
    scaled = logits / temperature
    kept = scaled.topk(k, dim=-1).indices
    return torch.full_like(scaled, float("-inf")).scatter(1, kept, scaled.gather(1, kept))


def _check(out, expected: torch.Tensor) -> None:
    for row, token, entry in zip(expected, out.token_ids, out.logprobs, strict=True):
        assert entry[token] == pytest.approx(row[token].item(), abs=1e-3)
        for t, value in entry.items():
            assert value == pytest.approx(row[t].item(), abs=1e-3)


@pytest.mark.parametrize("mode", ["raw_logits", "processed_logprobs", "processed_logits"])
def test_each_mode_reports_what_it_names(tiny_llama_dir, hf, mode):
    with LLM(tiny_llama_dir, show_progress=False, logprobs_mode=mode) as llm:
        sampled, greedy = llm.generate([PROMPT, PROMPT], [SAMPLED, GREEDY])
    for out, params in ((sampled.outputs[0], SAMPLED), (greedy.outputs[0], GREEDY)):
        logits = _logits(hf, out.token_ids)
        if mode == "raw_logits":
            _check(out, logits)
            continue
        drawn_from = _biased(logits)
        if not params.greedy:
            drawn_from = _top_k_scaled(drawn_from, params.top_k, params.temperature)
        _check(out, drawn_from if mode == "processed_logits"
               else torch.log_softmax(drawn_from, dim=-1))
    if mode != "raw_logits":  # top 4 of a top-3 row: the fourth is ruled out
        assert all(min(entry.values()) == float("-inf") for entry in sampled.outputs[0].logprobs)

