"""Prefix caching for models whose layers keep a recurrent state (Qwen3.5's gated delta nets,
Nemotron-H's Mamba-2 layers, Falcon-H1's beside attention in every layer, Falcon Mamba's
Mamba-1 layers with no attention at all): a cached prefix resumes only where the prefix cache
kept the state after it (core/kv_cache/state_checkpoints.py). A prompt's chunk is cut at its
last block boundary (a conversation's next turn resumes there) and where the prefix found
cached for it ends (the next request sharing that prefix resumes there). Greedy output equals
transformers' whether a request resumes or not, batched, preempted, under async scheduling
and when the checkpoints are evicted."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from falcon_h1_support import falcon_h1_config
from hybrid_support import ENGINE, MAX_NEW, greedy
from mamba1_support import mamba1_config
from model_support import hf_greedy, hf_reference, make_random_model
from nemotron_h_support import nemotron_h_config
from qwen3_5_support import qwen3_5_config
from transformers import AutoConfig

from tokenmill.engine import LLM
from tokenmill.engine.contract.config import ConfigError
from tokenmill.engine.core.kv_cache.state_checkpoints import StateCheckpoints
from tokenmill.engine.execution.kv_layout import KVCacheLayout

BLOCK = ENGINE["block_size"]


def _config(family: str, vocab: int):
    if family == "nemotron_h":  # Mamba-2 with MLPs and attention
        return nemotron_h_config(vocab, layers_block_type=[
            "linear_attention", "mlp", "full_attention", "mlp", "linear_attention", "mlp"])
    if family == "falcon_h1":  # every layer keeps keys and values and a state
        return falcon_h1_config(vocab)
    if family == "falcon_mamba":  # Mamba-1 alone: a state per channel
        return mamba1_config(vocab, falcon=True)
    return qwen3_5_config(vocab)


@pytest.fixture(scope="module", params=["qwen3_5", "nemotron_h", "falcon_h1",
                                                     "falcon_mamba"])
def model(request, tmp_path_factory, vocab_tokenizer):
    """A random checkpoint and transformers' greedy continuation of a prompt."""
    directory = make_random_model(str(tmp_path_factory.mktemp(request.param)),
                                  _config(request.param, len(vocab_tokenizer)),
                                  vocab_tokenizer, draw_norms=True)
    reference = hf_reference(directory)
    return directory, lambda prompt: hf_greedy(reference, prompt, MAX_NEW)


def _words(tokenizer, text: str, count: int) -> list[int]:
    ids = tokenizer.encode(" ".join([text] * count))
    assert len(ids) >= count
    return ids[:count]


def _hits(llm: LLM, prompt: list[int]) -> tuple[list[int], int]:
    """The greedy continuation of `prompt` alone, and its tokens found cached."""
    before = llm.engine.kv.prefix_hits
    return greedy(llm, [prompt])[0][0], llm.engine.kv.prefix_hits - before


def test_a_conversations_next_turn_resumes_at_the_last_block_of_its_prompt(
        model, vocab_tokenizer):
    directory, expected = model
    first = _words(vocab_tokenizer, "the mill turns", 37)
    with LLM(directory, **ENGINE) as llm:
        answer, hits = _hits(llm, first)
        assert (answer, hits) == (expected(first), 0)
        assert llm.engine.kv.checkpoints.num_kept == 1  # after 32 tokens
        again = first[:33]  # its last token is computed again
        assert _hits(llm, again) == (expected(again), 32)
        second = first + answer + _words(vocab_tokenizer, "and then", 6)
        assert _hits(llm, second) == (expected(second), 32)
        llm.engine.kv.allocator.check_all_free()


def test_requests_sharing_a_prefix_resume_where_it_ends(model, vocab_tokenizer):
    """The second request finds the first's blocks for the 24 tokens they share but no state
    there: it computes from the start, and keeps the state at 24, where the third resumes."""
    directory, expected = model
    system = _words(vocab_tokenizer, "you are a careful miller", 30)
    prompts = [system + _words(vocab_tokenizer, question, 9)
               for question in ("why grind", "what flour", "how fast")]
    with LLM(directory, **ENGINE) as llm:
        assert [_hits(llm, p) for p in prompts] == [(expected(prompts[0]), 0),
                                                    (expected(prompts[1]), 0),
                                                    (expected(prompts[2]), 24)]


def test_batched_preempted_evicted_and_async_resumes_equal_transformers(model,
                                                                       vocab_tokenizer):
    """Eight prompts over one shared prefix: batched, with a pool too small for them all
    (preempted sequences resume from what is kept), with one checkpoint slot (max_num_seqs
    4) evicted over and over, and under async scheduling."""
    directory, expected = model
    shared = _words(vocab_tokenizer, "grain and water and stone", 21)
    prompts = [shared + _words(vocab_tokenizer, f"turn {i} of the wheel", 3 + 2 * i)
               for i in range(8)]
    wanted = [expected(p) for p in prompts]
    runs = [dict(ENGINE), dict(ENGINE, num_gpu_blocks_override=12),
            dict(ENGINE, max_num_seqs=4), dict(ENGINE, async_scheduling=True)]
    for options in runs:
        with LLM(directory, **options) as llm:
            assert [out[0] for out in greedy(llm, prompts)] == wanted
            assert [out[0] for out in greedy(llm, prompts)] == wanted
            assert llm.engine.kv.prefix_hits > 0
            llm.engine.kv.allocator.check_all_free()
            assert llm.engine.kv.states.num_free == options["max_num_seqs"]
            if "num_gpu_blocks_override" in options:
                assert llm.engine.scheduler.num_preemptions > 0


def test_conversations_resume_from_the_host_tier(model, vocab_tokenizer):
    """A device pool of eight blocks for three conversations: their first turns' blocks go
    to the host tier, and each next turn copies them back and resumes from its checkpoint
    (of the eight a 32-sequence engine keeps)."""
    directory, expected = model
    firsts = [_words(vocab_tokenizer, f"tale {i} of the mill", 29) for i in range(3)]
    layout = KVCacheLayout.for_model(AutoConfig.from_pretrained(directory), BLOCK,
                                     torch.float32)
    if not layout.bytes_per_block:
        pytest.skip("an attention-free model keeps nothing to offload (test_mamba2 checks "
                    "that a host tier is refused)")
    with LLM(directory, kv_cache_memory=8 * layout.bytes_per_block,
             kv_offloading_size=64 * layout.bytes_per_block / (1 << 30),
             **dict(ENGINE, max_num_seqs=32)) as llm:
        answers = [_hits(llm, p)[0] for p in firsts]
        assert answers == [expected(p) for p in firsts]
        nexts = [p + a + _words(vocab_tokenizer, "and then", 4) for p, a in zip(
            firsts, answers, strict=True)]
        assert [_hits(llm, p) for p in nexts] == [(expected(p), 24) for p in nexts]
        assert llm.engine.kv.host_prefix_hits > 0
        llm.engine.kv.allocator.check_all_free()


def test_beam_search_rounds_resume_from_checkpoints(model, vocab_tokenizer):
    """Each round of beam search asks again for its beams' whole tokens: it resumes from the
    checkpoints the rounds before kept, and the beams equal transformers' generate."""
    from tokenmill.engine.core.beam_search import BeamSearchParams

    directory, _ = model
    prompt = _words(vocab_tokenizer, "the mill turns", 36)
    out = hf_reference(directory).generate(
        torch.tensor([prompt]), num_beams=3, num_return_sequences=3, do_sample=False,
        max_new_tokens=10, early_stopping=False, pad_token_id=0)
    with LLM(directory, **ENGINE) as llm:
        found = llm.beam_search([prompt], BeamSearchParams(beam_width=3, max_tokens=10))
        assert llm.engine.kv.prefix_hits > 0
    assert [s.tokens[len(prompt):] for s in found[0].sequences] == \
        [row[len(prompt):].tolist() for row in out]


@pytest.mark.parametrize("options", [dict(enable_prefix_caching=False),
                                     dict(mamba_cache_mode="none")])
def test_without_prefix_caching_or_with_mamba_cache_mode_none_nothing_is_kept(
        model, vocab_tokenizer, options):
    """No state slot is set aside for checkpoints, and a prompt seen before is computed
    whole again (vLLM's --mamba-cache-mode none; its "all" is refused)."""
    directory, expected = model
    prompt = _words(vocab_tokenizer, "the mill turns", 37)
    with LLM(directory, **options, **ENGINE) as llm:
        assert llm.engine.kv.checkpoints is None
        assert llm.engine.runner.states.ssm.shape[1] == ENGINE["max_num_seqs"] + 1
        assert _hits(llm, prompt) == (expected(prompt), 0)
        assert _hits(llm, prompt) == (expected(prompt), 0)
    with pytest.raises(ConfigError, match="mamba_cache_mode.*'all'.*not served"):
        LLM(directory, mamba_cache_mode="all", **ENGINE)


@dataclass
class _Seq:
    """What a checkpoint reads of a sequence."""

    tokens: list[int]
    state_slot: int
    cache_salt: str | None = None

    def cache_token_ids(self) -> list[int]:
        return self.tokens


def _sequence(tokens: list[int], slot: int) -> _Seq:
    return _Seq(tokens, slot)


def test_a_checkpoint_is_found_only_after_its_copy_is_handed_out_and_lru_goes_first():
    """Slots 4 and 5 hold checkpoints. A save queued during a step's scheduling is copied
    before the next step and found from then on; a third save takes the least recently
    found checkpoint's slot."""
    nodes = {(1,) * 8: 101, (2,) * 8: 102, (3,) * 8: 103}
    checkpoints = StateCheckpoints(4, 2, 8, lambda tokens, salt: nodes.get(tuple(tokens)))
    checkpoints.save(_sequence([1] * 9, slot=0), 8)
    assert checkpoints.take_copies() == []  # the step computing the state runs first
    assert checkpoints.find([101]) is None
    assert checkpoints.take_copies() == [(0, 4)]
    assert checkpoints.find([7]) is None
    assert checkpoints.find([101, 7]) == (1, 4)  # the longest prefix kept: one block
    checkpoints.save(_sequence([2] * 9, slot=1), 8)
    assert checkpoints.take_copies() == []
    assert checkpoints.take_copies() == [(1, 5)]
    checkpoints.find([101])  # 101 used last: 102 goes first
    checkpoints.save(_sequence([3] * 9, slot=2), 8)
    checkpoints.save(_sequence([1] * 9, slot=3), 8, node=101)  # kept already: not again
    checkpoints.restore(4, into=3)
    assert checkpoints.take_copies() == [(4, 3)]
    assert checkpoints.take_copies() == [(2, 5)]
    assert checkpoints.find([102]) is None and checkpoints.find([103]) == (1, 5)
    checkpoints.clear()
    assert checkpoints.find([101]) is None and checkpoints.num_kept == 0


class _Cuts:
    """A KV cache manager whose checkpoint cut is fixed."""

    def __init__(self, cut: int | None):
        self.cut = cut

    def checkpoint_cut(self, seq, start: int) -> int | None:
        return self.cut


def test_a_chunk_is_cut_where_a_state_is_kept_unless_that_cuts_an_image_seen_both_ways():
    """From token 10 with 30 to go: cut at 24; with an image seen both ways over 10..40 the
    cut would split it, so the chunk runs whole (0 would stall the sequence)."""
    from types import SimpleNamespace

    from tokenmill.engine.core.images import ImageSpan
    from tokenmill.engine.core.scheduler import Scheduler

    plain = SimpleNamespace(images=[])
    image = SimpleNamespace(images=[ImageSpan(image=None, offset=10, length=30,
                                              both_ways=True)])
    scheduler = Scheduler(_Cuts(24), max_num_seqs=4, max_num_batched_tokens=64)
    assert scheduler._chunk(plain, 10, 30) == 14
    assert scheduler._chunk(image, 10, 30) == 30
    assert Scheduler(_Cuts(None), 4, 64)._chunk(plain, 10, 30) == 30
    assert Scheduler(_Cuts(24), 4, 64, chunked_prefill=False)._chunk(plain, 10, 30) == 30
