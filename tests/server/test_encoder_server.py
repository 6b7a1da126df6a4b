"""Encoders served over HTTP, as TEI and vLLM serve them: a BERT embedding model answers the
official openai client's embeddings call with sentence-transformers' vectors, and a BERT
cross-encoder answers /score and /rerank with transformers' scores of each pair (its two texts
two segments); generation routes are 400s that say what the model serves."""

from __future__ import annotations

import copy

import httpx
import openai
import pytest
import torch
from embedding_support import st_embeddings
from encoder_support import (
    hf_pair_logits,
    make_cross_encoder,
    make_encoder_embedding,
    make_wordpiece_tokenizer,
)
from model_support import REFERENCE
from server_support import in_process_server

TEXTS = ["hello world", "where is berlin? in germany, a big city"]
QUERY = "where is paris?"
DOCUMENTS = ["berlin is in germany.", "the capital of france is paris.", "b"]


@pytest.fixture(scope="module")
def wordpiece(tmp_path_factory):
    return make_wordpiece_tokenizer(str(tmp_path_factory.mktemp("wordpiece")))


@pytest.fixture(scope="module")
def embedder(tmp_path_factory, wordpiece):
    path = make_encoder_embedding(str(tmp_path_factory.mktemp("bge")), wordpiece, "bert",
                                  "cls")
    with in_process_server(path, "bge", **REFERENCE) as server:
        yield server, path


@pytest.fixture(scope="module")
def reranker(tmp_path_factory, wordpiece):
    path = make_cross_encoder(str(tmp_path_factory.mktemp("minilm")), wordpiece, "bert")
    with in_process_server(path, "minilm", **REFERENCE) as server:
        yield server, path


def test_the_openai_client_gets_sentence_transformers_embeddings(embedder, wordpiece):
    server, path = embedder
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    reply = client.embeddings.create(model="bge", input=TEXTS)
    got = torch.tensor([d.embedding for d in reply.data])
    torch.testing.assert_close(got, st_embeddings(path, TEXTS), atol=1e-5, rtol=0)
    assert reply.usage.prompt_tokens == sum(len(wordpiece(t)["input_ids"]) for t in TEXTS)
    chat = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "model": "bge", "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 400
    assert "it generates no text" in chat.json()["error"]["message"]


def test_truncation_keeps_the_cls_row_an_encoder_pools(embedder, wordpiece):
    """truncate_prompt_tokens keeps [CLS] ... [SEP] around the text's last tokens, as
    sentence-transformers embeds a text truncated by its tokenizer: a plain cut of the last
    tokens pooled a word's row as [CLS]'s."""
    server, path = embedder
    ids = wordpiece(TEXTS[1])["input_ids"]
    keep = 6
    kept_text = wordpiece.decode(ids[len(ids) - keep + 1:-1])
    assert wordpiece(kept_text)["input_ids"] == [ids[0], *ids[len(ids) - keep + 1:]]
    reply = httpx.post(server.url + "/v1/embeddings", timeout=60, json={
        "model": "bge", "input": TEXTS[1], "truncate_prompt_tokens": keep}).json()
    assert reply["usage"]["prompt_tokens"] == keep
    torch.testing.assert_close(torch.tensor([reply["data"][0]["embedding"]]),
                               st_embeddings(path, [kept_text]), atol=1e-5, rtol=0)


def test_a_cross_encoder_scores_and_reranks_pairs_as_two_segments(reranker, wordpiece):
    server, path = reranker
    reference = torch.sigmoid(hf_pair_logits(path, [(QUERY, d) for d in DOCUMENTS])[:, 0])
    scored = httpx.post(server.url + "/v1/score", timeout=60, json={
        "model": "minilm", "text_1": QUERY, "text_2": DOCUMENTS}).json()
    assert [d["score"] for d in scored["data"]] == pytest.approx(reference.tolist(), abs=1e-5)
    reranked = httpx.post(server.url + "/v1/rerank", timeout=60, json={
        "model": "minilm", "query": QUERY, "documents": DOCUMENTS, "top_n": 2}).json()
    best = reference.argsort(descending=True)[:2].tolist()
    assert [r["index"] for r in reranked["results"]] == best
    assert [r["relevance_score"] for r in reranked["results"]] == \
        pytest.approx(reference[best].tolist(), abs=1e-5)
    # Cut as the tokenizer's own longest_first truncation from the left cuts the pair (vLLM's
    # truncate_prompt_tokens): the longer text loses its first tokens, [CLS] and both [SEP]
    # stay, the tokens kept keep their types.
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32)
    left = copy.deepcopy(wordpiece)
    left.truncation_side = "left"
    for first, second in [(QUERY, DOCUMENTS[1]), (DOCUMENTS[1], QUERY)]:
        keep = len(wordpiece(first, second)["input_ids"]) - 4
        pair = left(first, second, truncation="longest_first", max_length=keep)
        cut = httpx.post(server.url + "/score", timeout=60, json={
            "model": "minilm", "text_1": first, "text_2": second,
            "truncate_prompt_tokens": keep, "use_activation": False}).json()
        with torch.no_grad():
            expected = model(input_ids=torch.tensor([pair["input_ids"]]),
                             token_type_ids=torch.tensor([pair["token_type_ids"]])).logits
        assert cut["data"][0]["score"] == pytest.approx(expected[0, 0].item(), abs=1e-5)
        assert cut["usage"]["prompt_tokens"] == len(pair["input_ids"]) == keep
        assert pair["input_ids"].count(wordpiece.sep_token_id) == 2


def test_pooling_returns_what_the_model_pools_for(embedder, reranker, tiny_server):
    """vLLM's /pooling: an embedding model's vectors (as /v1/embeddings), a classifier's
    probabilities (as /classify); a generative model pools nothing."""
    server, _ = embedder
    pooled = httpx.post(server.url + "/pooling", timeout=60,
                        json={"model": "bge", "input": TEXTS}).json()
    vectors = httpx.post(server.url + "/v1/embeddings", timeout=60,
                         json={"model": "bge", "input": TEXTS}).json()
    assert [d["object"] for d in pooled["data"]] == ["pooling", "pooling"]
    # Equal up to rounding: how the inputs share steps may differ between the two calls.
    torch.testing.assert_close(torch.tensor([d["data"] for d in pooled["data"]]),
                               torch.tensor([d["embedding"] for d in vectors["data"]]),
                               atol=1e-6, rtol=0)
    assert pooled["usage"] == vectors["usage"]
    server, _ = reranker
    pooled = httpx.post(server.url + "/pooling", timeout=60,
                        json={"model": "minilm", "input": TEXTS}).json()
    classified = httpx.post(server.url + "/classify", timeout=60,
                            json={"model": "minilm", "input": TEXTS}).json()
    torch.testing.assert_close(torch.tensor([d["data"] for d in pooled["data"]]),
                               torch.tensor([d["probs"] for d in classified["data"]]),
                               atol=1e-6, rtol=0)
    refused = httpx.post(tiny_server.url + "/pooling", timeout=60,
                         json={"model": "tiny", "input": "a"})
    assert refused.status_code == 400 and "makes no embeddings" in refused.text
    # vLLM's task: one the model does not pool for, or a per-token task, is named, not ignored.
    for task, says in (("embed", "pools for classify, not embed"),
                       ("token_embed", "'embed' or 'classify'")):
        other = httpx.post(server.url + "/pooling", timeout=60,
                           json={"model": "minilm", "input": TEXTS, "task": task})
        assert other.status_code == 400 and other.json()["error"]["param"] == "task"
        assert says in other.json()["error"]["message"]
