"""The pooling runner (embeddings) equals sentence-transformers on the same checkpoint, for every
pooling type, whatever the batching, chunking, prefix caching and preemption; and it refuses
what cannot work, naming the option or field."""

from __future__ import annotations

import json
import os

import pytest
import torch
from embedding_support import HIDDEN_SIZE, make_embedding_model, st_embeddings
from model_support import REFERENCE

from tokenmill.engine import LLM
from tokenmill.engine.contract.config import ConfigError, EngineConfig
from tokenmill.engine.core import PoolingParams, SamplingParams
from tokenmill.engine.core.errors import RequestError
from tokenmill.engine.models.source import ModelLoadError

TEXTS = ["hello world", "a",
         "The capital of France is Paris, and this sentence runs longer than the others.",
         "The capital of France is Paris, and this sentence runs longer"]
SMALL = {"kv_cache_memory": 16 << 20, **REFERENCE}
# Prompts split over several steps, several in one step, blocks of 8 tokens.
CHUNKED = {"max_num_batched_tokens": 8, "max_num_seqs": 4, "block_size": 8}


@pytest.fixture(scope="module", params=["LAST", "MEAN", "CLS"])
def embedding_model(request, tmp_path_factory, vocab_tokenizer):
    path = make_embedding_model(str(tmp_path_factory.mktemp("embed")), vocab_tokenizer,
                                request.param)
    return request.param, path, st_embeddings(path, TEXTS)


def _embed(llm: LLM, texts, params: PoolingParams | None = None) -> torch.Tensor:
    return torch.tensor([out.outputs.embedding for out in llm.embed(texts, params)])


@pytest.mark.parametrize("options", [{}, CHUNKED, {**CHUNKED, "async_scheduling": True}],
                         ids=["whole", "chunked", "chunked-async"])
def test_embeddings_equal_sentence_transformers(embedding_model, options):
    pooling_type, path, reference = embedding_model
    with LLM(path, show_progress=False, **SMALL, **options) as llm:
        assert llm.engine.runner_kind == "pooling"  # runner auto: a bare decoder
        assert llm.engine.pooler.pooling_type == pooling_type
        first = _embed(llm, TEXTS)
        again = _embed(llm, TEXTS)  # LAST: from the prefix cache, all but the last token
        assert llm.engine.kv.allocator.num_used == 0
    torch.testing.assert_close(first, reference, atol=1e-5, rtol=0)
    torch.testing.assert_close(again, reference, atol=1e-5, rtol=0)
    assert torch.allclose(first.norm(dim=1), torch.ones(len(TEXTS)))


def test_truncate_prompt_tokens_embeds_the_prompts_last_tokens(embedding_model):
    """vLLM's LLM.embed(..., truncate_prompt_tokens=k): the vector of the last k tokens, as
    embedding those tokens gives it."""
    _, path, _ = embedding_model
    with LLM(path, show_progress=False, **SMALL) as llm:
        ids = llm.tokenizer.encode(TEXTS[2])
        [cut] = llm.embed([TEXTS[2]], truncate_prompt_tokens=5)
        [tail] = llm.embed([ids[-5:]])
        assert cut.prompt_token_ids == ids[-5:]
        torch.testing.assert_close(torch.tensor(cut.outputs.embedding),
                                   torch.tensor(tail.outputs.embedding))
        with pytest.raises(ValueError, match="truncate_prompt_tokens: must be -1"):
            llm.embed([TEXTS[0]], truncate_prompt_tokens=0)


def test_prefix_cache_serves_last_pooling_only(embedding_model):
    pooling_type, path, _ = embedding_model
    with LLM(path, show_progress=False, **SMALL, block_size=8) as llm:
        llm.embed(TEXTS[2:3])
        out = llm.engine
        llm.embed(TEXTS[3:4])  # shares its first blocks with the prompt before
        cached = out.kv.stats().cached_blocks
    assert (cached > 0) == (pooling_type == "LAST")


def test_a_causal_lm_config_without_its_head_embeds_by_its_modules(tmp_path, vocab_tokenizer):
    """Checkpoints that name the causal LM in config.json but ship the bare decoder's weights
    (no LM head, no `model.` prefix) and sentence-transformers' modules: runner auto reads the
    modules."""
    path = make_embedding_model(str(tmp_path), vocab_tokenizer, "LAST")
    reference = st_embeddings(path, TEXTS)
    config_file = os.path.join(path, "config.json")
    with open(config_file) as f:
        config = json.load(f)
    with open(config_file, "w") as f:
        json.dump({**config, "architectures": ["Qwen3ForCausalLM"]}, f)
    with LLM(path, show_progress=False, **SMALL) as llm:
        assert llm.engine.runner_kind == "pooling"
        got = _embed(llm, TEXTS)
    torch.testing.assert_close(got, reference, atol=1e-5, rtol=0)


def test_a_preempted_prompt_starts_its_sums_again(tmp_path, vocab_tokenizer):
    """A prompt preempted after some chunks (the scheduler frees its blocks; chunked prompts
    that outgrow the pool are) is recomputed from its start: the sums of its first run must
    not count twice."""
    path = make_embedding_model(str(tmp_path), vocab_tokenizer, "MEAN")
    text = " ".join(["word"] * 30)
    reference = st_embeddings(path, [text])
    with LLM(path, show_progress=False, **SMALL, **CHUNKED) as llm:
        engine = llm.engine
        engine.add_request("r", text, pooling=PoolingParams())
        engine.step()
        engine.step()
        seq = engine._requests["r"].seqs[0]
        assert seq.num_computed_tokens == 16 and seq.pooling.sums is not None
        engine.scheduler.preempt(seq)
        outputs = []
        while engine.has_unfinished_requests():
            outputs += [o for o in engine.step() if o.finished]
    assert outputs[0].num_preemptions == 1
    torch.testing.assert_close(torch.tensor([outputs[0].embedding]), reference, atol=1e-5,
                               rtol=0)


def test_a_generative_checkpoint_embeds_its_last_hidden_state(tiny_llama_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    hf = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        hidden = [hf(torch.tensor([tokenizer.encode(t)]), output_hidden_states=True)
                  .hidden_states[-1][0, -1] for t in TEXTS]
    raw = torch.stack(hidden)
    with LLM(tiny_llama_dir, show_progress=False, runner="pooling", **SMALL) as llm:
        normalized = _embed(llm, TEXTS)
        unnormalized = _embed(llm, TEXTS, PoolingParams(normalize=False))
        cut = _embed(llm, TEXTS, PoolingParams(dimensions=16))
    torch.testing.assert_close(unnormalized, raw, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(normalized, torch.nn.functional.normalize(raw, dim=1),
                               atol=1e-5, rtol=0)
    torch.testing.assert_close(cut, torch.nn.functional.normalize(raw[:, :16], dim=1),
                               atol=1e-5, rtol=0)
    with LLM(tiny_llama_dir, show_progress=False, **SMALL) as llm:
        assert llm.engine.runner_kind == "generate"  # runner auto: a model with its LM head
        with pytest.raises(RequestError, match="makes no embeddings"):
            llm.embed(["hi"])


def test_pooler_config_overrides_the_models_files(tmp_path, vocab_tokenizer):
    path = make_embedding_model(str(tmp_path), vocab_tokenizer, "LAST")
    mean = make_embedding_model(str(tmp_path / "mean"), vocab_tokenizer, "MEAN",
                                normalize=False)
    reference = st_embeddings(mean, TEXTS)  # the same weights (seeded), MEAN, not normalized
    config = json.dumps({"pooling_type": "mean", "normalize": False})
    with LLM(path, show_progress=False, pooler_config=config, **SMALL) as llm:
        got = _embed(llm, TEXTS)
    torch.testing.assert_close(got, reference, atol=1e-5, rtol=0)


def test_embedding_requests_are_checked(tmp_path, vocab_tokenizer):
    path = make_embedding_model(str(tmp_path), vocab_tokenizer, "LAST")
    with LLM(path, show_progress=False, max_model_len=32, **SMALL) as llm:
        with pytest.raises(RequestError, match=r"dimensions must be in \[1, 64\]") as error:
            llm.embed(["hi"], PoolingParams(dimensions=65))
        assert error.value.param == "dimensions"
        with pytest.raises(RequestError, match="generates no text"):
            llm.generate(["hi"], SamplingParams(max_tokens=2))
        with pytest.raises(RequestError, match="maximum context length is 32 tokens, but the "
                                               "request asks for 40 in the prompt"):
            llm.embed([[5] * 40])
        assert len(llm.embed([[5] * 32])[0].outputs.embedding) == HIDDEN_SIZE
        with pytest.raises(RequestError, match="empty"):
            llm.embed([[]])


def test_runner_choices_are_checked(tmp_path, vocab_tokenizer):
    path = make_embedding_model(str(tmp_path), vocab_tokenizer, "LAST")
    with pytest.raises(ConfigError, match="runner: the checkpoint is a bare decoder "
                                          r"\(Qwen3Model\).*--runner pooling"):
        LLM(path, show_progress=False, runner="generate", **SMALL)
    with pytest.raises(ConfigError, match="runner: 'embed' is not one of"):
        EngineConfig(runner="embed")
    with pytest.raises(ConfigError, match="pooler_config: pooling_type 'MAX' is not one of"):
        EngineConfig(pooler_config='{"pooling_type": "MAX"}')
    with pytest.raises(ConfigError, match=r"pooler_config: unknown keys \['dim'\]"):
        EngineConfig(pooler_config='{"dim": 3}')
    with pytest.raises(ConfigError, match="pooler_config: is not JSON"):
        EngineConfig(pooler_config="{mean}")
    with pytest.raises(ConfigError, match="speculative_config: speculative decoding"):
        EngineConfig(runner="pooling",
                     speculative_config='{"method": "ngram", "num_speculative_tokens": 2}')
    with pytest.raises(ConfigError, match="enable_lora: LoRA adapters"):
        LLM(path, show_progress=False, enable_lora=True, **SMALL)  # runner auto -> pooling


def test_steps_the_engine_does_not_compute_are_refused(tmp_path, vocab_tokenizer):
    path = make_embedding_model(str(tmp_path), vocab_tokenizer, "LAST")
    modules_file = os.path.join(path, "modules.json")
    with open(modules_file) as f:
        modules = json.load(f)
    modules.append({"idx": 3, "name": "3", "path": "3_Dense",
                    "type": "sentence_transformers.models.Dense"})
    with open(modules_file, "w") as f:
        json.dump(modules, f)
    with pytest.raises(ModelLoadError, match="module 'Dense' .* is not supported"):
        LLM(path, show_progress=False, **SMALL)
