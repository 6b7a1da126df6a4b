"""Encoders (BERT, XLM-RoBERTa) under the pooling runner: embeddings equal
sentence-transformers' on the same files, a cross-encoder's pair scores and a classifier's
probabilities equal transformers' (BERT's pair read with its token types), whatever the
batching; each prompt runs whole in one step with no KV memory; and what an encoder cannot
run with is refused, naming the option."""

from __future__ import annotations

import copy
import itertools
import os

import pytest
import torch
from embedding_support import st_embeddings
from encoder_support import (
    LABELS,
    WORDS,
    hf_pair_logits,
    make_cross_encoder,
    make_encoder_embedding,
    make_wordpiece_tokenizer,
)
from model_support import REFERENCE

from tokenmill.engine import LLM
from tokenmill.engine.contract.config import ConfigError
from tokenmill.engine.core import PoolingParams
from tokenmill.engine.core.errors import RequestError
from tokenmill.engine.models.encoder_weights import parameter_name
from tokenmill.engine.models.source import ModelLoadError

TEXTS = ["hello world", "a", "where is berlin? in germany, a big city, and this sentence runs "
         "longer than the others", "the capital of france is paris"]
PAIRS = [("where is paris?", "the capital of france is paris."),
         ("where is paris?", "berlin is in germany."), ("a", "b"),
         ("the capital of france is paris.", "where is paris?")]
# A step's budget fits one long prompt only: the prompts run over several steps, each whole.
SMALL_STEPS = {"max_num_batched_tokens": 128, "max_num_seqs": 2}


@pytest.fixture(scope="module")
def wordpiece(tmp_path_factory):
    return make_wordpiece_tokenizer(str(tmp_path_factory.mktemp("wordpiece")))


# Each family once or twice: what a pooling mode reads is the same for every encoder.
@pytest.mark.parametrize(("family", "mode"), [("bert", "cls"), ("bert", "mean"),
                                              ("xlm-roberta", "cls"), ("distilbert", "mean"),
                                              ("modernbert", "mean")])
def test_embeddings_equal_sentence_transformers(tmp_path, wordpiece, family, mode):
    path = make_encoder_embedding(str(tmp_path), wordpiece, family, mode)
    reference = st_embeddings(path, TEXTS)
    with LLM(path, show_progress=False, **REFERENCE, **SMALL_STEPS) as llm:
        engine = llm.engine
        assert (engine.runner_kind, engine.task) == ("pooling", "embed")
        assert engine.pooler.pooling_type == mode.upper()
        assert engine.memory_report()["kv_pool_bytes"] == 0
        assert engine.kv.prefix_cache is None and not engine.scheduler.chunked_prefill
        got = torch.tensor([out.outputs.embedding for out in llm.embed(TEXTS)])
        again = torch.tensor([out.outputs.data for out in llm.encode(TEXTS[::-1])])
        assert engine.kv.allocator.num_used == 0
    torch.testing.assert_close(got, reference, atol=1e-5, rtol=0)
    torch.testing.assert_close(again, reference.flip(0), atol=1e-5, rtol=0)


def test_without_sentence_transformers_files_the_first_token_embeds(tmp_path, wordpiece):
    from transformers import AutoModel

    path = make_encoder_embedding(str(tmp_path), wordpiece, "bert", "mean")
    raw = os.path.join(os.path.dirname(path), "decoder")  # the bare BertModel under it
    with LLM(raw, show_progress=False, **REFERENCE) as llm:
        assert llm.engine.pooler.pooling_type == "CLS" and llm.engine.pooler.normalize
        got = torch.tensor(llm.embed(TEXTS[:2])[1].outputs.embedding)
    model = AutoModel.from_pretrained(raw, dtype=torch.float32)
    with torch.no_grad():
        hidden = model(**wordpiece(TEXTS[1], return_tensors="pt")).last_hidden_state[0, 0]
    torch.testing.assert_close(got, torch.nn.functional.normalize(hidden, dim=0), atol=1e-5,
                               rtol=0)


@pytest.mark.parametrize("family", ["bert", "xlm-roberta"])
def test_cross_encoder_scores_equal_transformers(tmp_path, wordpiece, family):
    path = make_cross_encoder(str(tmp_path), wordpiece, family)
    logits = hf_pair_logits(path, PAIRS)[:, 0]
    queries, documents = [q for q, _ in PAIRS], [d for _, d in PAIRS]
    raw = PoolingParams(use_activation=False)
    with LLM(path, show_progress=False, **REFERENCE, **SMALL_STEPS) as llm:
        assert llm.engine.pooler.classifier.token_types == (family == "bert")
        scores = [out.outputs.score for out in llm.score(queries, documents)]
        raw_scores = [out.outputs.score for out in llm.score(queries, documents,
                                                             pooling_params=raw)]
    assert raw_scores == pytest.approx(logits.tolist(), abs=1e-5)
    assert scores == pytest.approx(torch.sigmoid(logits).tolist(), abs=1e-6)
    # The order of a pair matters: its two texts are two segments, not one text.
    assert abs(raw_scores[0] - raw_scores[3]) > 1e-3


def test_offline_scores_of_cut_pairs_equal_transformers_on_the_tokenizers_cut(tmp_path,
                                                                             wordpiece):
    """vLLM's LLM.score(..., truncate_prompt_tokens=k): each pair cut as the tokenizer's own
    left-side longest_first truncation cuts it, then scored: transformers' logit of that cut."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = make_cross_encoder(str(tmp_path), wordpiece, "bert")
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.truncation_side = "left"
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32)
    queries, documents = [q for q, _ in PAIRS], [d for _, d in PAIRS]
    keep = 8
    lengths = [len(tokenizer(q, d)["input_ids"]) for q, d in PAIRS]
    assert sum(n > keep for n in lengths) == 3 and min(lengths) < keep  # ("a", "b") is whole
    with torch.no_grad():
        want = [model(**tokenizer(q, d, truncation="longest_first", max_length=keep,
                                  return_tensors="pt")).logits[0, 0].item()
                for q, d in PAIRS]
    with LLM(path, show_progress=False, **REFERENCE) as llm:
        outs = llm.score(queries, documents, truncate_prompt_tokens=keep,
                         pooling_params=PoolingParams(use_activation=False))
    assert [out.outputs.score for out in outs] == pytest.approx(want, abs=1e-5)
    assert all(len(out.prompt_token_ids) <= keep for out in outs)


def test_a_pair_is_cut_as_the_tokenizers_longest_first_truncation_cuts_it(wordpiece):
    """truncate_prompt_tokens on a pair: the tokens and types the tokenizer's own
    longest_first truncation from the left keeps, for every length of either text."""
    from tokenmill.engine.contract.pooling import Classifier
    from tokenmill.engine.core import pair_prompt

    left = copy.deepcopy(wordpiece)
    left.truncation_side = "left"
    classifier = Classifier(labels=("score",), token_types=True)
    words = iter(itertools.cycle(WORDS))
    for first, second in itertools.product(range(1, 8), repeat=2):
        a = " ".join(itertools.islice(words, first))
        b = " ".join(itertools.islice(words, second))
        whole = len(wordpiece(a, b)["input_ids"])
        for keep in range(4, whole + 2):
            cut = left(a, b, truncation="longest_first", max_length=keep)
            ids, types = pair_prompt(wordpiece, a, b, classifier, keep)
            assert (ids, list(types)) == (cut["input_ids"], cut["token_type_ids"])


@pytest.mark.parametrize("family", ["bert", "distilbert", "modernbert"])
def test_a_classifier_gives_each_labels_probability(tmp_path, wordpiece, family):
    """A BERT-family text classifier (DistilBERT's SST-2 is the common one): each label's
    probability, as transformers computes it."""
    from transformers import AutoModelForSequenceClassification

    path = make_cross_encoder(str(tmp_path), wordpiece, family, labels=LABELS)
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        reference = torch.stack([torch.softmax(model(**wordpiece(t, return_tensors="pt"))
                                               .logits[0], dim=0) for t in TEXTS])
    with LLM(path, show_progress=False, **REFERENCE) as llm:
        assert llm.engine.pooler.classifier.labels == tuple(LABELS.values())
        got = torch.tensor([out.outputs.probs for out in llm.classify(TEXTS)])
        # vLLM's LLM.encode: whatever the model pools for, here the same probabilities.
        encoded = torch.tensor([out.outputs.data for out in llm.encode(TEXTS)])
    torch.testing.assert_close(got, reference, atol=1e-5, rtol=0)
    torch.testing.assert_close(encoded, reference, atol=1e-5, rtol=0)


def test_what_an_encoder_cannot_run_with_is_refused(tmp_path, wordpiece):
    embedder = make_encoder_embedding(str(tmp_path / "embed"), wordpiece, "bert", "cls")
    scorer = make_cross_encoder(str(tmp_path / "cross"), wordpiece, "bert")
    for options, option in (({"runner": "generate"}, "runner"),
                            ({"tensor_parallel_size": 2}, "tensor_parallel_size"),
                            ({"quantization": "int8"}, "quantization")):
        with pytest.raises(ConfigError) as caught:
            LLM(embedder, show_progress=False, **{**REFERENCE, **options})
        assert caught.value.option == option, options
    with pytest.raises(ConfigError, match="first token") as caught:
        LLM(scorer, show_progress=False, pooler_config='{"pooling_type": "MEAN"}', **REFERENCE)
    assert caught.value.option == "pooler_config"
    with LLM(embedder, show_progress=False, max_num_batched_tokens=64, max_num_seqs=4,
             **REFERENCE) as llm:
        assert llm.engine.max_model_len == 128
        # A step's budget grows to the context length: no prompt can be split.
        assert llm.engine.scheduler.max_num_batched_tokens == 128
        assert len(llm.embed([" ".join(["a"] * 126)])[0].outputs.embedding) == 64
        with pytest.raises(RequestError, match="128"):
            llm.embed([" ".join(["a"] * 200)])
        with pytest.raises(RequestError) as caught:
            llm.embed(["a"], pooling_params=PoolingParams(token_type_ids=(0, 0, 0)))
        assert caught.value.param == "token_type_ids"
    with LLM(scorer, show_progress=False, **REFERENCE) as llm:
        for types in ((0, 1), (0, 2, 0)):  # one type per token, each one the model has
            with pytest.raises(RequestError) as caught:
                llm.engine.check_request([2, 5, 3], None, pooling=PoolingParams(
                    task="classify", token_type_ids=types))
            assert caught.value.param == "token_type_ids"


def test_encoders_it_does_not_compute_are_refused_at_load(tmp_path, wordpiece):
    path = make_encoder_embedding(str(tmp_path), wordpiece, "bert", "cls")
    raw = os.path.join(os.path.dirname(path), "decoder")
    with pytest.raises(ModelLoadError, match="relative_key"):
        LLM(raw, show_progress=False, hf_overrides='{"position_embedding_type": "relative_key"}',
            **REFERENCE)
    with pytest.raises(ModelLoadError, match="activation 'swish'"):
        LLM(raw, show_progress=False, hf_overrides='{"hidden_act": "swish"}', **REFERENCE)
    modern = make_cross_encoder(str(tmp_path / "modern"), wordpiece, "modernbert")
    with pytest.raises(ModelLoadError, match="classifier_pooling 'mean'"):
        LLM(modern, show_progress=False, hf_overrides='{"classifier_pooling": "mean"}',
            **REFERENCE)


@pytest.mark.parametrize(("stored", "classifier", "placed"), [
    ("bert.encoder.layer.0.attention.self.query.weight", False,
     "encoder.layer.0.attention.self.query.weight"),
    ("encoder.layer.1.output.LayerNorm.gamma", False, "encoder.layer.1.output.LayerNorm.weight"),
    ("embeddings.LayerNorm.beta", False, "embeddings.LayerNorm.bias"),
    ("roberta.embeddings.word_embeddings.weight", True, "embeddings.word_embeddings.weight"),
    ("pooler.dense.weight", False, None),
    ("bert.pooler.dense.bias", True, "score.dense.bias"),
    ("classifier.weight", True, "score.out.weight"),
    ("classifier.dense.weight", True, "score.dense.weight"),
    ("classifier.out_proj.bias", True, "score.out.bias"),
    ("embeddings.position_ids", False, None),
    ("cls.predictions.bias", False, None),
    ("distilbert.transformer.layer.1.attention.q_lin.weight", False,
     "encoder.layer.1.attention.self.query.weight"),
    ("distilbert.transformer.layer.0.sa_layer_norm.bias", True,
     "encoder.layer.0.attention.output.LayerNorm.bias"),
    ("distilbert.transformer.layer.0.ffn.lin2.weight", False,
     "encoder.layer.0.output.dense.weight"),
    ("pre_classifier.weight", True, "score.dense.weight"),
    ("vocab_projector.bias", False, None),
])
def test_checkpoint_names_find_their_parameters(stored, classifier, placed):
    assert parameter_name(stored, classifier) == placed
