"""Sequence classifiers (a decoder with a `score` head: text classifiers, reward models,
cross-encoder rerankers) under the pooling runner: each prompt's probabilities equal
transformers' on the same checkpoint, whatever the batching, chunking, prefix caching and
tensor parallelism; a cross-encoder scores a pair read as one prompt; and what cannot work is
refused, naming the option or call."""

from __future__ import annotations

import pytest
import torch
from classifier_support import (
    LABELS,
    hf_last_logits,
    hf_logits,
    make_llama_cross_encoder,
    make_qwen3_causal,
    make_qwen3_classifier,
)
from model_support import REFERENCE

from tokenmill.engine import LLM
from tokenmill.engine.contract.config import ConfigError
from tokenmill.engine.core import PoolingParams, SamplingParams
from tokenmill.engine.core.errors import RequestError
from tokenmill.engine.models.source import ModelLoadError

TEXTS = ["hello world", "a",
         "The capital of France is Paris, and this sentence runs longer than the others.",
         "The capital of France is Paris, and this sentence runs longer"]
QUERY = "Where is Paris?"
DOCUMENTS = ["The capital of France is Paris.", "Berlin is in Germany.", "b"]
SMALL = {"kv_cache_memory": 16 << 20, **REFERENCE}
# Prompts split over several steps, several in one step, blocks of 8 tokens.
CHUNKED = {"max_num_batched_tokens": 8, "max_num_seqs": 4, "block_size": 8}


@pytest.fixture(scope="module")
def classifier(tmp_path_factory, vocab_tokenizer):
    return make_qwen3_classifier(str(tmp_path_factory.mktemp("classifier")), vocab_tokenizer)


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory, vocab_tokenizer):
    return make_llama_cross_encoder(str(tmp_path_factory.mktemp("cross")), vocab_tokenizer)


def _probs(outputs) -> torch.Tensor:
    return torch.tensor([out.outputs.probs for out in outputs])


@pytest.mark.parametrize("options", [{}, CHUNKED, {"tensor_parallel_size": 2}],
                         ids=["whole", "chunked", "tp2"])
def test_probabilities_equal_transformers(classifier, vocab_tokenizer, options):
    ids = [vocab_tokenizer.encode(text) for text in TEXTS]
    reference = torch.softmax(hf_logits(classifier, ids), dim=-1)
    with LLM(classifier, show_progress=False, **SMALL, **options) as llm:
        assert (llm.engine.runner_kind, llm.engine.task) == ("pooling", "classify")
        assert llm.engine.pooler.classifier.labels == tuple(LABELS.values())
        first = llm.classify(TEXTS)
        again = llm.classify(TEXTS)  # from the prefix cache, all but the last token
        assert llm.engine.kv.allocator.num_used == 0
    assert [out.outputs.num_classes for out in first] == [3] * len(TEXTS)
    assert [out.prompt_token_ids for out in first] == ids
    torch.testing.assert_close(_probs(first), reference, atol=1e-5, rtol=0)
    torch.testing.assert_close(_probs(again), reference, atol=1e-5, rtol=0)


def test_without_activation_the_logits_come_back(classifier, cross_encoder, vocab_tokenizer):
    ids = [vocab_tokenizer.encode(text) for text in TEXTS[:2]]
    raw = PoolingParams(use_activation=False)
    with LLM(classifier, show_progress=False, **SMALL) as llm:
        got = _probs(llm.classify(TEXTS[:2], pooling_params=raw))
    torch.testing.assert_close(got, hf_logits(classifier, ids), atol=1e-5, rtol=0)
    pair = vocab_tokenizer(QUERY, DOCUMENTS[0])["input_ids"]
    with LLM(cross_encoder, show_progress=False, **SMALL) as llm:
        score = llm.score(QUERY, DOCUMENTS[0], pooling_params=raw)[0].outputs.score
    assert score == pytest.approx(hf_logits(cross_encoder, [pair])[0, 0].item(), abs=1e-5)


def test_independent_labels_each_take_a_sigmoid(classifier, vocab_tokenizer):
    ids = [vocab_tokenizer.encode(text) for text in TEXTS[:2]]
    reference = torch.sigmoid(hf_logits(classifier, ids))
    overrides = {"problem_type": "multi_label_classification"}  # a dict, as vLLM's LLM takes
    with LLM(classifier, show_progress=False, hf_overrides=overrides, **SMALL) as llm:
        got = _probs(llm.classify(TEXTS[:2]))
    torch.testing.assert_close(got, reference, atol=1e-5, rtol=0)


def test_a_cross_encoder_scores_each_pair_as_one_prompt(cross_encoder, vocab_tokenizer):
    pairs = [vocab_tokenizer(QUERY, doc)["input_ids"] for doc in DOCUMENTS]
    reference = torch.sigmoid(hf_logits(cross_encoder, pairs))[:, 0]
    with LLM(cross_encoder, show_progress=False, **SMALL, **CHUNKED) as llm:
        scores = llm.score(QUERY, DOCUMENTS)
        paired = llm.score([QUERY, DOCUMENTS[1]], DOCUMENTS[:2])
        alone = llm.classify([pairs[0]])
    assert [out.prompt_token_ids for out in scores] == pairs
    torch.testing.assert_close(torch.tensor([out.outputs.score for out in scores]), reference,
                               atol=1e-5, rtol=0)
    assert alone[0].outputs.probs == pytest.approx([scores[0].outputs.score], abs=1e-6)
    assert paired[0].outputs.score == pytest.approx(scores[0].outputs.score, abs=1e-6)
    joined = vocab_tokenizer(DOCUMENTS[1] + DOCUMENTS[1])["input_ids"]
    assert paired[1].prompt_token_ids == vocab_tokenizer(DOCUMENTS[1], DOCUMENTS[1])[
        "input_ids"]
    # A causal LM made a reranker reads the pair as one text (vLLM's use_pad_token false).
    with LLM(cross_encoder, show_progress=False, hf_overrides={"use_pad_token": False},
             **SMALL) as llm:
        one_text = llm.score(DOCUMENTS[1], DOCUMENTS[1])
    assert one_text[0].prompt_token_ids == joined
    expected = torch.sigmoid(hf_logits(cross_encoder, [joined]))[0, 0].item()
    assert one_text[0].outputs.score == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize(("tie", "options"), [(False, {}), (True, {"tensor_parallel_size": 2})],
                         ids=["own-head", "tied-tp2"])
def test_a_causal_lm_reranks_by_two_tokens_logits(tmp_path, vocab_tokenizer, tie, options):
    """Qwen3-Reranker's way, served as vLLM serves it: a pair's score is the softmax of the
    last position's logits over ("no", "yes"), taken at "yes"."""
    path = make_qwen3_causal(str(tmp_path), vocab_tokenizer, tie)
    no, yes = 100, 40000  # any two tokens; under two ranks, one on each
    tokens = vocab_tokenizer.convert_ids_to_tokens([no, yes])
    overrides = {"architectures": ["Qwen3ForSequenceClassification"],
                 "classifier_from_token": tokens, "is_original_qwen3_reranker": True}
    joined = [vocab_tokenizer(QUERY + doc)["input_ids"] for doc in DOCUMENTS]
    reference = torch.softmax(hf_last_logits(path, joined)[:, [no, yes]], dim=-1)[:, 1]
    with LLM(path, show_progress=False, hf_overrides=overrides, **SMALL, **options) as llm:
        assert llm.engine.pooler.classifier.labels == (tokens[1],)
        scores = llm.score(QUERY, DOCUMENTS)
    assert [out.prompt_token_ids for out in scores] == joined
    torch.testing.assert_close(torch.tensor([out.outputs.score for out in scores]), reference,
                               atol=1e-5, rtol=0)


def test_chosen_tokens_logits_are_a_classifiers_labels(tmp_path, vocab_tokenizer):
    path = make_qwen3_causal(str(tmp_path), vocab_tokenizer, tie=False)
    ids = [7, 300, 4000]
    tokens = vocab_tokenizer.convert_ids_to_tokens(ids)
    overrides = {"architectures": ["Qwen3ForSequenceClassification"],
                 "classifier_from_token": tokens}
    prompts = [vocab_tokenizer.encode(text) for text in TEXTS]
    reference = torch.softmax(hf_last_logits(path, prompts)[:, ids], dim=-1)
    with LLM(path, show_progress=False, hf_overrides=overrides, **SMALL) as llm:
        assert llm.engine.pooler.classifier.labels == tuple(tokens)
        got = _probs(llm.classify(TEXTS))
    torch.testing.assert_close(got, reference, atol=1e-5, rtol=0)
    bad = {**overrides, "classifier_from_token": ["no such token here"]}
    with pytest.raises(ConfigError, match="hf_overrides: classifier_from_token 'no such token "
                                          "here' is not one token of the tokenizer's"):
        LLM(path, show_progress=False, hf_overrides=bad, **SMALL)
    three = {**overrides, "is_original_qwen3_reranker": True}
    with pytest.raises(ModelLoadError, match="reads two tokens in classifier_from_token, got "
                                             "3"):
        LLM(path, show_progress=False, hf_overrides=three, **SMALL)


def test_what_a_classifier_cannot_do_is_refused(classifier, cross_encoder):
    with pytest.raises(ConfigError, match=r"runner: the checkpoint is a sequence classifier "
                                          r"\(Qwen3ForSequenceClassification\).*--runner "
                                          "pooling"):
        LLM(classifier, show_progress=False, runner="generate", **SMALL)
    with LLM(classifier, show_progress=False, **SMALL) as llm:
        with pytest.raises(RequestError, match="served for classification .* makes no "
                                               "embeddings"):
            llm.embed(["hi"])
        with pytest.raises(RequestError, match="served for classification .* generates no "
                                               "text"):
            llm.generate(["hi"], SamplingParams(max_tokens=2))
        with pytest.raises(RequestError, match="dimensions: a classifier's output is one "
                                               "value per label") as error:
            llm.engine.check_request("hi", None, pooling=PoolingParams(dimensions=2,
                                                                       task="classify"))
        assert error.value.param == "dimensions"
        with pytest.raises(ValueError, match="scoring needs a classifier with one label; "
                                             "this one has 3"):
            llm.score(QUERY, DOCUMENTS)
        with pytest.raises(ValueError, match="data_1 holds 2 texts and data_2 3"):
            llm.score(DOCUMENTS[:2], DOCUMENTS)


def test_a_generative_model_classifies_nothing(tiny_llama):
    with pytest.raises(RequestError, match=r"served for generation \(--runner generate\): it "
                                           "has no classification head"):
        tiny_llama.classify(["hi"])
