"""vLLM's /score and the rerank API (Jina's and Cohere's shape) for an embedding model: each
score is the cosine similarity of the two texts' embeddings, the very vectors /v1/embeddings
returns (sentence-transformers' own); rerank orders documents best first and keeps top_n;
bad bodies are 400s naming the field, and a generative model refuses both."""

from __future__ import annotations

import httpx
import pytest
import torch
from embedding_support import make_embedding_model, st_embeddings
from model_support import REFERENCE
from server_support import in_process_server

QUERY = "Where is Paris?"
DOCUMENTS = ["The capital of France is Paris.", "a", "Berlin is in Germany.",
             "Paris is in France, on the Seine."]


@pytest.fixture(scope="module")
def embedding_model(tmp_path_factory, vocab_tokenizer):
    return make_embedding_model(str(tmp_path_factory.mktemp("embed")), vocab_tokenizer, "MEAN")


@pytest.fixture(scope="module")
def server(embedding_model):
    with in_process_server(embedding_model, "embedder", kv_cache_memory=16 << 20,
                           max_model_len=64, max_num_batched_tokens=16, max_num_seqs=8,
                           **REFERENCE) as server:
        yield server


@pytest.fixture(scope="module")
def cosine(embedding_model):
    """Each (text, text) pair's cosine similarity from sentence-transformers' embeddings."""
    texts = [QUERY, *DOCUMENTS]
    vectors = dict(zip(texts, st_embeddings(embedding_model, texts), strict=True))
    return lambda a, b: torch.nn.functional.cosine_similarity(vectors[a], vectors[b],
                                                              dim=0).item()


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json={"model": "embedder", **body}, timeout=60)


@pytest.mark.parametrize("path", ["/score", "/v1/score"])
def test_one_text_against_each_is_their_cosine_similarity(server, cosine, path):
    reply = _post(server, path, {"text_1": QUERY, "text_2": DOCUMENTS})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["object"] == "list" and body["model"] == "embedder"
    assert [d["index"] for d in body["data"]] == list(range(len(DOCUMENTS)))
    assert all(d["object"] == "score" for d in body["data"])
    got = [d["score"] for d in body["data"]]
    assert got == pytest.approx([cosine(QUERY, d) for d in DOCUMENTS], abs=1e-5)
    tokens = sum(len(server.state.tokenizer.encode(t)) for t in [QUERY, *DOCUMENTS])
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}


def test_two_lists_pair_up_and_a_one_item_list_broadcasts(server, cosine):
    pairs = _post(server, "/score", {"text_1": DOCUMENTS[:2], "text_2": DOCUMENTS[2:]}).json()
    assert [d["score"] for d in pairs["data"]] == pytest.approx(
        [cosine(DOCUMENTS[0], DOCUMENTS[2]), cosine(DOCUMENTS[1], DOCUMENTS[3])], abs=1e-5)
    one = _post(server, "/score", {"text_1": [QUERY], "text_2": DOCUMENTS[:2]}).json()
    assert [d["score"] for d in one["data"]] == pytest.approx(
        [cosine(QUERY, d) for d in DOCUMENTS[:2]], abs=1e-5)
    same = _post(server, "/score", {"text_1": QUERY, "text_2": QUERY}).json()
    assert same["data"][0]["score"] == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
def test_rerank_returns_documents_best_first(server, cosine, path):
    reply = _post(server, path, {"query": QUERY, "documents": DOCUMENTS})
    assert reply.status_code == 200, reply.text
    results = reply.json()["results"]
    want = sorted(range(len(DOCUMENTS)), key=lambda i: -cosine(QUERY, DOCUMENTS[i]))
    assert [r["index"] for r in results] == want
    assert [r["relevance_score"] for r in results] == pytest.approx(
        [cosine(QUERY, DOCUMENTS[i]) for i in want], abs=1e-5)
    assert [r["document"]["text"] for r in results] == [DOCUMENTS[i] for i in want]
    assert reply.json()["usage"]["total_tokens"] > 0


def test_rerank_keeps_top_n_and_takes_cohere_documents(server, cosine):
    reply = _post(server, "/v1/rerank", {"query": QUERY, "top_n": 2, "return_documents": False,
                                         "documents": [{"text": d} for d in DOCUMENTS]})
    results = reply.json()["results"]
    want = sorted(range(len(DOCUMENTS)), key=lambda i: -cosine(QUERY, DOCUMENTS[i]))[:2]
    assert [r["index"] for r in results] == want
    assert all(r["document"] is None for r in results)


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/score", {"text_1": ["a", "b"], "text_2": ["c"]}, "text_1"),
    ("/score", {"text_1": "a", "text_2": []}, "text_2"),
    ("/score", {"text_1": "", "text_2": "b"}, "text_1"),
    ("/score", {"text_1": "a"}, "text_2"),
    ("/rerank", {"query": "q", "documents": []}, "documents"),
    ("/rerank", {"query": "q", "documents": ["a"], "top_n": -1}, "top_n"),
    ("/rerank", {"documents": ["a"]}, "query"),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "truncate_prompt_tokens": 0},
     "truncate_prompt_tokens"),
])
def test_bad_bodies_are_400s_naming_the_field(server, path, body, param):
    reply = _post(server, path, body)
    assert reply.status_code == 400, reply.text
    assert param in reply.json()["error"]["message"] + str(reply.json()["error"]["param"])
    assert _post(server, "/score", {"text_1": "a", "text_2": "b"}).status_code == 200


@pytest.mark.parametrize(("text_2", "says"), [
    (["a"] * 2049, "at most 2048 items"), ([], "at least 1 item"), ([""], "at least 1 character"),
])
def test_a_list_where_a_text_may_also_go_is_told_what_is_wrong_with_it(server, text_2, says):
    """text_2 is a text or a list of texts: the error is the list's, not "a valid string"."""
    reply = _post(server, "/score", {"text_1": "a", "text_2": text_2})
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == "text_2" and says in error["message"], error


@pytest.mark.parametrize(("path", "body"), [
    ("/score", {"text_1": "a", "text_2": "b"}), ("/v1/rerank", {"query": "a", "documents": ["b"]}),
    ("/v1/embeddings", {"input": "a"})])
def test_under_fcfs_a_priority_is_a_400_naming_it(server, path, body):
    reply = _post(server, path, {**body, "priority": 2})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == "priority"
    assert _post(server, path, {**body, "priority": 0}).status_code == 200


def test_a_generative_model_refuses_scores(tiny_server):
    for path, body in (("/score", {"text_1": "a", "text_2": "b"}),
                       ("/v1/rerank", {"query": "a", "documents": ["b"]})):
        reply = httpx.post(tiny_server.url + path, json={"model": "tiny", **body}, timeout=60)
        assert reply.status_code == 400, reply.text
        assert "--runner pooling" in reply.json()["error"]["message"]


def test_an_embedding_model_classifies_nothing(server):
    reply = _post(server, "/classify", {"input": "a"})
    assert reply.status_code == 400, reply.text
    assert "served for embeddings (--runner pooling): it has no classification head; use " \
        "/v1/embeddings" in reply.json()["error"]["message"]


def test_invocations_answer_as_embeddings_score_and_rerank(server, cosine):
    """SageMaker's /invocations (vLLM's): the body's fields pick the route."""
    scored = _post(server, "/invocations", {"text_1": QUERY, "text_2": DOCUMENTS[0]}).json()
    assert scored["data"][0]["score"] == pytest.approx(cosine(QUERY, DOCUMENTS[0]), abs=1e-5)
    reranked = _post(server, "/invocations", {"query": QUERY, "documents": DOCUMENTS}).json()
    assert [r["relevance_score"] for r in reranked["results"]] == \
        pytest.approx(sorted((cosine(QUERY, d) for d in DOCUMENTS), reverse=True), abs=1e-5)
    embedded = _post(server, "/invocations", {"input": [QUERY]}).json()["data"]
    direct = _post(server, "/v1/embeddings", {"input": [QUERY]}).json()["data"]
    assert embedded[0]["object"] == "embedding"
    assert embedded[0]["embedding"] == pytest.approx(direct[0]["embedding"], abs=1e-5)
