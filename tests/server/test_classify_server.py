"""vLLM's /classify for a sequence classifier: each input's probabilities (transformers' own)
and its most likely label's name, inputs as texts, token ids or a conversation; a
cross-encoder (one label) answers /score and /rerank by reading each pair as one prompt; and
routes the model does not serve are 400s that say what it serves."""

from __future__ import annotations

import httpx
import pytest
import torch
from classifier_support import LABELS, hf_logits, make_llama_cross_encoder, make_qwen3_classifier
from model_support import REFERENCE
from server_support import in_process_server

TEXTS = ["hello world", "The capital of France is Paris."]
QUERY = "Where is Paris?"
DOCUMENTS = ["Berlin is in Germany.", "The capital of France is Paris.", "b"]
ENGINE = {"kv_cache_memory": 16 << 20, "max_model_len": 64, "max_num_batched_tokens": 16,
          "max_num_seqs": 8, **REFERENCE}


@pytest.fixture(scope="module")
def classifier(tmp_path_factory, vocab_tokenizer):
    return make_qwen3_classifier(str(tmp_path_factory.mktemp("classifier")), vocab_tokenizer)


@pytest.fixture(scope="module")
def server(classifier):
    with in_process_server(classifier, "sentiment", **ENGINE) as server:
        yield server


@pytest.fixture(scope="module")
def cross_server(tmp_path_factory, vocab_tokenizer):
    path = make_llama_cross_encoder(str(tmp_path_factory.mktemp("cross")), vocab_tokenizer)
    with in_process_server(path, "reranker", **ENGINE) as server:
        yield server, path


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=60)


@pytest.mark.parametrize("path", ["/classify", "/v1/classify"])
def test_each_input_gets_its_probabilities_and_label(server, classifier, vocab_tokenizer,
                                                     path):
    ids = [vocab_tokenizer.encode(text) for text in TEXTS]
    reference = torch.softmax(hf_logits(classifier, ids), dim=-1)
    reply = _post(server, path, {"model": "sentiment", "input": TEXTS})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["object"] == "list" and body["model"] == "sentiment"
    assert body["id"].startswith("classify-")
    assert [d["index"] for d in body["data"]] == [0, 1]
    assert [d["num_classes"] for d in body["data"]] == [3, 3]
    got = torch.tensor([d["probs"] for d in body["data"]])
    torch.testing.assert_close(got, reference, atol=1e-5, rtol=0)
    assert [d["label"] for d in body["data"]] == [LABELS[int(i)] for i in
                                                  reference.argmax(dim=-1)]
    tokens = sum(map(len, ids))
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens,
                             "completion_tokens": 0, "prompt_tokens_details": None}


def test_token_ids_and_truncation_classify_those_tokens(server, classifier, vocab_tokenizer):
    ids = vocab_tokenizer.encode(TEXTS[1])
    reference = torch.softmax(hf_logits(classifier, [ids, ids[-3:]]), dim=-1)
    whole = _post(server, "/classify", {"input": ids}).json()["data"][0]["probs"]
    cut = _post(server, "/classify", {"input": TEXTS[1], "truncate_prompt_tokens": 3}).json()
    torch.testing.assert_close(torch.tensor([whole, cut["data"][0]["probs"]]), reference,
                               atol=1e-5, rtol=0)
    assert cut["usage"]["prompt_tokens"] == 3


@pytest.mark.parametrize("field", ["use_activation", "activation"])
def test_without_activation_the_logits_come_back(server, classifier, vocab_tokenizer, field):
    ids = [vocab_tokenizer.encode(text) for text in TEXTS]
    reply = _post(server, "/classify", {"input": TEXTS, field: False})
    assert reply.status_code == 200, reply.text
    got = torch.tensor([d["probs"] for d in reply.json()["data"]])
    torch.testing.assert_close(got, hf_logits(classifier, ids), atol=1e-5, rtol=0)
    bad = _post(server, "/classify", {"input": "a", field: "no"})
    assert bad.status_code == 400 and field in bad.text


def test_what_the_classifier_does_not_serve_is_a_400(server):
    for path, body, says in (
            ("/v1/embeddings", {"input": "a"}, "it makes no embeddings; use /classify"),
            ("/v1/completions", {"prompt": "a"}, "it generates no text; use /classify"),
            ("/score", {"text_1": "a", "text_2": "b"}, "with 3 labels: scoring needs one"),
            ("/rerank", {"query": "a", "documents": ["b"]}, "use /classify")):
        reply = _post(server, path, {"model": "sentiment", **body})
        assert reply.status_code == 400, reply.text
        assert says in reply.json()["error"]["message"]
        assert reply.json()["error"]["param"] == "model"
    for body, param in (({"input": []}, "input"), ({}, "give either input or messages"),
                        ({"input": "a", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
                        ({"model": "other", "input": "a"}, "model")):
        reply = _post(server, "/classify", body)
        assert reply.status_code in (400, 404), reply.text
        error = reply.json()["error"]
        assert param in error["message"] + str(error["param"])
    assert _post(server, "/classify", {"input": "a"}).status_code == 200


def test_a_cross_encoder_scores_and_reranks_each_pair_as_one_prompt(cross_server,
                                                                   vocab_tokenizer):
    server, path = cross_server
    pairs = [vocab_tokenizer(QUERY, doc)["input_ids"] for doc in DOCUMENTS]
    reference = torch.sigmoid(hf_logits(path, pairs))[:, 0].tolist()
    scored = _post(server, "/v1/score", {"text_1": QUERY, "text_2": DOCUMENTS}).json()
    assert [d["score"] for d in scored["data"]] == pytest.approx(reference, abs=1e-5)
    assert scored["usage"]["prompt_tokens"] == sum(map(len, pairs))
    reranked = _post(server, "/rerank", {"query": QUERY, "documents": DOCUMENTS,
                                         "top_n": 2}).json()
    best = sorted(range(len(DOCUMENTS)), key=lambda i: -reference[i])[:2]
    assert [r["index"] for r in reranked["results"]] == best
    assert [r["relevance_score"] for r in reranked["results"]] == \
        pytest.approx([reference[i] for i in best], abs=1e-5)
    assert reranked["results"][0]["document"] == {"text": DOCUMENTS[best[0]]}
    raw = _post(server, "/score", {"text_1": QUERY, "text_2": DOCUMENTS[0],
                                   "use_activation": False}).json()["data"][0]["score"]
    assert raw == pytest.approx(hf_logits(path, pairs[:1])[0, 0].item(), abs=1e-5)
    one = _post(server, "/classify", {"input": pairs[0]}).json()["data"][0]
    assert one["num_classes"] == 1 and one["label"] == "LABEL_0"
    assert one["probs"][0] == pytest.approx(reference[0], abs=1e-5)


def test_a_generative_model_classifies_nothing(tiny_server):
    reply = httpx.post(tiny_server.url + "/classify", json={"model": "tiny", "input": "a"},
                       timeout=60)
    assert reply.status_code == 400, reply.text
    assert "served for generation (--runner generate): it has no classification head" in \
        reply.json()["error"]["message"]


def test_invocations_classify_and_rerank_with_a_classifier(server, cross_server):
    """SageMaker's /invocations (vLLM's): the body's fields pick the route."""
    body = {"input": TEXTS}
    invoked = _post(server, "/invocations", body).json()["data"]
    direct = _post(server, "/classify", body).json()["data"]
    assert [d["label"] for d in invoked] == [d["label"] for d in direct]
    torch.testing.assert_close(torch.tensor([d["probs"] for d in invoked]),
                               torch.tensor([d["probs"] for d in direct]), atol=1e-5, rtol=0)
    rerank = {"query": QUERY, "documents": DOCUMENTS}
    cross, _ = cross_server
    invoked = _post(cross, "/invocations", rerank).json()["results"]
    direct = _post(cross, "/rerank", rerank).json()["results"]
    assert [r["index"] for r in invoked] == [r["index"] for r in direct]
    assert [r["relevance_score"] for r in invoked] == \
        pytest.approx([r["relevance_score"] for r in direct], abs=1e-5)
