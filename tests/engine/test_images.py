"""Prompts with images (LLaVA, Gemma 3): the engine's greedy tokens and their
log-probabilities equal transformers' on the same images, whether the prompt's chunks cut an
image (LLaVA) or must not (Gemma 3, whose image rows see each other both ways), prompts batch
with text-only ones, a preempted prompt is recomputed, or the prefix cache serves a prompt
again; the prefix cache tells images apart by their pixels; what cannot be read is
refused."""

from __future__ import annotations

import dataclasses
import functools
import re

import pytest
import torch
from image_support import (
    HFGemma3,
    HFIdefics3,
    HFInternVL,
    HFLlava,
    HFLlavaNext,
    HFLlavaOnevision,
    HFMistral3,
    HFQwenVL,
    drawn_image,
    make_gemma3,
    make_idefics3,
    make_internvl,
    make_llava,
    make_llava_next,
    make_llava_onevision,
    make_mistral3,
    make_qwen_vl,
)

from tokenmill.engine import LLM, SamplingParams
from tokenmill.engine.contract.config import ConfigError
from tokenmill.engine.core.errors import RequestError
from tokenmill.engine.core.images import ImageInput, place_images, whole_images
from tokenmill.engine.models.images import ImageTokens

MAX_NEW = 6
# A step of 12 tokens cuts each 16-row image in two.
ENGINE = dict(show_progress=False, block_size=8, max_num_seqs=4, max_num_batched_tokens=12,
              dtype="float32")


# Each family read: how its checkpoint is made (directory, tokenizer), and transformers'
# reference on it.
FAMILIES = {
    "clip": (make_llava, HFLlava),
    "siglip": (functools.partial(make_llava, tower="siglip"), HFLlava),
    "llava_next": (make_llava_next, HFLlavaNext),
    "llava_onevision": (make_llava_onevision, HFLlavaOnevision),
    "gemma3": (make_gemma3, HFGemma3),
    "mistral3": (make_mistral3, HFMistral3),
    "ministral3": (functools.partial(make_mistral3, ministral3=True), HFMistral3),
    "internvl": (make_internvl, HFInternVL),
    "idefics3": (make_idefics3, HFIdefics3),
    "smolvlm": (functools.partial(make_idefics3, smolvlm=True), HFIdefics3),
    "pixtral": (functools.partial(make_mistral3, pixtral_12b=True), HFMistral3),
    **{kind: (functools.partial(make_qwen_vl, kind=kind), HFQwenVL)
       for kind in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5")}}


@pytest.fixture(scope="module", params=list(FAMILIES))
def llava(request, tmp_path_factory, vocab_tokenizer):
    """A checkpoint that reads images, and transformers' model on it: LLaVA with either
    tower, LLaVA-NeXT, LLaVA-OneVision, Gemma 3, Mistral 3, Ministral 3, Pixtral 12B, InternVL,
    Idefics 3, SmolVLM, Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE or Qwen3.5."""
    make, reference = FAMILIES[request.param]
    directory = make(str(tmp_path_factory.mktemp(request.param)), vocab_tokenizer)
    return directory, reference(directory)


def _prompts(hf: HFLlava, tokenizer) -> list[tuple[list[int], list]]:
    image = hf.placeholder
    words = tokenizer.encode("describe the picture in a few words")
    return [(words[:3] + [image] + words[3:], [drawn_image(0)]),
            (words[:3] + [image] + words[3:], [drawn_image(1)]),
            ([image] + words[:2] + [image] + words[2:5],
             [drawn_image(2, (60, 20)), drawn_image(0)]),
            (words, [])]


def _request(ids: list[int], images: list) -> dict:
    return {"prompt_token_ids": ids, "multi_modal_data": {"image": images}}


def _generate(llm: LLM, prompts) -> list:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=0)
    return [o.outputs[0] for o in llm.generate([_request(*p) for p in prompts], params)]


def _check(outputs, expected) -> None:
    for out, (tokens, logprobs) in zip(outputs, expected, strict=True):
        assert out.token_ids == tokens
        got = [step[t] for step, t in zip(out.logprobs, out.token_ids, strict=True)]
        assert got == pytest.approx(logprobs, abs=1e-4)


def test_greedy_with_images_equals_transformers(llava, vocab_tokenizer):
    directory, hf = llava
    prompts = _prompts(hf, vocab_tokenizer)
    expected = [hf.greedy(ids, images, MAX_NEW) for ids, images in prompts]
    assert expected[0][1] != expected[1][1]  # the image changes the answer
    with LLM(directory, **ENGINE) as llm:
        _check(_generate(llm, prompts), expected)  # batched, in chunks
        hits = llm.engine.kv.prefix_hits
        _check(_generate(llm, prompts), expected)  # again, from the prefix cache
        # (none for a model with a state per sequence: Qwen3.5's)
        assert llm.engine.kv.prefix_hits > hits or llm.engine.kv.prefix_cache is None
        for prompt, answer in zip(prompts, expected, strict=True):  # alone
            _check(_generate(llm, [prompt]), [answer])
        llm.engine.kv.allocator.check_all_free()


def test_images_under_async_scheduling(llava, vocab_tokenizer):
    directory, hf = llava
    prompts = _prompts(hf, vocab_tokenizer)
    expected = [hf.greedy(ids, images, MAX_NEW) for ids, images in prompts]
    with LLM(directory, async_scheduling=True, **ENGINE) as llm:
        _check(_generate(llm, prompts), expected)  # batched, in chunks
        llm.engine.kv.allocator.check_all_free()


def test_a_preempted_prompt_encodes_its_images_again(tmp_path, vocab_tokenizer):
    directory = make_llava(str(tmp_path / "llava"), vocab_tokenizer)
    hf = HFLlava(directory)
    prompts = _prompts(hf, vocab_tokenizer)[:3]
    expected = [hf.greedy(ids, images, MAX_NEW) for ids, images in prompts]
    with LLM(directory, **ENGINE) as probe:
        block = probe.engine.runner.layout.bytes_per_block
    # 6 blocks of 8 tokens: one prompt with its images fits, three at once do not.
    with LLM(directory, **dict(ENGINE, enable_prefix_caching=False),
             kv_cache_memory=6 * block) as llm:
        _check(_generate(llm, prompts), expected)
        assert llm.engine.scheduler.num_preemptions > 0
        llm.engine.kv.allocator.check_all_free()


def test_the_prefix_cache_tells_images_apart(tmp_path, vocab_tokenizer):
    directory = make_llava(str(tmp_path / "llava"), vocab_tokenizer)
    hf = HFLlava(directory)
    words = vocab_tokenizer.encode("one two three four five six seven eight nine ten")
    ids = words[:10] + [hf.placeholder] + words[:8]  # the image starts in the second block
    assert len(words) >= 10 and len(hf.expand(ids)) == 34
    first, second = [drawn_image(0)], [drawn_image(5)]
    with LLM(directory, **ENGINE) as llm:
        _generate(llm, [(ids, first)])
        other = llm.generate([_request(ids, second)], SamplingParams(max_tokens=1))[0]
        # Only the text before the image is shared: its first whole block.
        assert other.num_cached_tokens == 8
        again = llm.generate([_request(ids, first)], SamplingParams(max_tokens=1))[0]
        assert again.num_cached_tokens == 32  # every whole block (34 tokens)
        outputs = _generate(llm, [(ids, second), (ids, first)])
        # Two answers to one prompt with an image share its blocks, encoded once.
        twice = llm.generate([_request(ids, second)], SamplingParams(
            n=2, temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True))[0]
    expected = [hf.greedy(ids, second, MAX_NEW), hf.greedy(ids, first, MAX_NEW)]
    _check(outputs, expected)
    assert [c.token_ids for c in twice.outputs] == [expected[0][0]] * 2


def test_placeholders_already_expanded_are_taken_as_they_are():
    images = [ImageInput.of(torch.zeros(3, 2, 2), 3), ImageInput.of(torch.ones(3, 2, 2), 3)]
    once, spans = place_images([5, 9, 6, 9], images, ImageTokens(9, 9, 3))
    assert once == [5, 9, 9, 9, 6, 9, 9, 9]
    assert [(s.offset, s.length, s.image) for s in spans] == [(1, 3, images[0]),
                                                              (5, 3, images[1])]
    again, spans_again = place_images(once, images, ImageTokens(9, 9, 3))
    assert again == once and [s.offset for s in spans_again] == [1, 5]
    adjacent, spans = place_images([9, 9, 9, 9, 9, 9], images, ImageTokens(9, 9, 3))
    assert [s.offset for s in spans] == [0, 3]
    assert images[0].cache_key != images[1].cache_key and images[0].cache_key < 0


def test_a_gemma3_prompt_given_as_text_is_expanded_as_its_processor_writes_it(
        tmp_path, vocab_tokenizer):
    directory = make_gemma3(str(tmp_path / "gemma3"), vocab_tokenizer)
    hf = HFGemma3(directory)
    text = "Look:<start_of_image>What is it?"
    ids = hf.tokenizer.encode("Look:\n\n<start_of_image>" + "<image_soft_token>" * 4
                              + "<end_of_image>\n\nWhat is it?")
    with LLM(directory, **ENGINE) as llm:
        prompt = llm.engine.check_request(text, SamplingParams(), images=[drawn_image(0)])[1]
        assert prompt == ids
        _check(_generate(llm, [(text, [drawn_image(0)])]),
               [hf.greedy(ids, [drawn_image(0)], MAX_NEW, expanded=True)])


def test_a_step_that_cannot_hold_a_whole_gemma3_image_is_refused(tmp_path, vocab_tokenizer):
    directory = make_gemma3(str(tmp_path / "gemma3"), vocab_tokenizer)
    with pytest.raises(ConfigError, match="max_num_batched_tokens: 3 cannot hold one image's 4 "
                                          "tokens"):
        LLM(directory, **dict(ENGINE, max_num_batched_tokens=3, max_num_seqs=2))


def test_chunks_never_cut_an_image_seen_both_ways():
    tokens = ImageTokens(7, 9, 4, both_ways=True)
    image = ImageInput.of(torch.zeros(3, 2, 2), 4)
    _, spans = place_images([1, 2, 7, 3, 7], [image, image], tokens)
    assert [(s.offset, s.end) for s in spans] == [(2, 6), (7, 11)]
    assert whole_images(spans, 0, 4) == 2      # stops before the first image
    assert whole_images(spans, 0, 6) == 6      # ends with it
    assert whole_images(spans, 3, 2) == 0      # starts inside: its rest does not fit
    assert whole_images(spans, 3, 3) == 3      # starts inside: runs to its end
    assert whole_images(spans, 3, 5) == 4      # ... and on, stopping before the next
    assert whole_images(spans, 6, 5) == 5
    assert whole_images([dataclasses.replace(s, both_ways=False) for s in spans], 0, 4) == 4


@pytest.mark.parametrize("ids,count,message", [
    ([5, 6], 1, "holds 0 image placeholder tokens (id 9) for 1 images"),
    ([9, 9], 1, "holds 2 image placeholder tokens (id 9) for 1 images"),
    ([9, 9, 5, 9, 9, 9, 9], 2, "image 0's tokens (id 9) must come 3 in a row"),
])
def test_placeholders_that_do_not_match_the_images_are_refused(ids, count, message):
    images = [ImageInput.of(torch.full((3, 2, 2), float(i)), 3) for i in range(count)]
    with pytest.raises(RequestError, match=re.escape(message)):
        place_images(ids, images, ImageTokens(9, 9, 3))


def test_what_cannot_be_read_is_refused(tmp_path, vocab_tokenizer, tiny_llama):
    directory = make_llava(str(tmp_path / "llava"), vocab_tokenizer)
    placeholder = HFLlava(directory).placeholder
    with LLM(directory, **ENGINE, limit_mm_per_prompt="image=0") as llm:
        assert llm.engine.images is None and llm.engine.runner.image_encoder is None
        with pytest.raises(RequestError, match="reads text only"):
            llm.generate([_request([5, placeholder], [drawn_image(0)])])
    with LLM(directory, **ENGINE, limit_mm_per_prompt={"image": 1}) as llm:
        with pytest.raises(RequestError, match="at most 1 per prompt"):
            llm.generate([_request([5, placeholder, placeholder],
                                   [drawn_image(0), drawn_image(1)])])
        with pytest.raises(RequestError, match="image 0 cannot be read"):
            llm.generate([_request([5, placeholder], ["not an image"])])
        with pytest.raises(RequestError, match="holds 0 image placeholder tokens"):
            llm.generate([_request([5, 6], [drawn_image(0)])])
        assert llm.engine.num_waiting == 0  # nothing was queued
    with pytest.raises(RequestError, match=r"reads text only: a prompt cannot carry images"):
        tiny_llama.generate([_request([5, 6], [drawn_image(0)])])
    # A tower of another type, or no image processor settings: served as text only.
    import json

    config_path = tmp_path / "llava" / "config.json"
    config = json.loads(config_path.read_text())
    config["vision_config"]["model_type"] = "siglip2_vision_model"
    config_path.write_text(json.dumps(config))
    with LLM(directory, **ENGINE) as llm:
        assert llm.engine.images is None
        assert llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2))[0].outputs[0].token_ids


@pytest.mark.parametrize("family", ["gemma3", "qwen2_5_vl"])
def test_images_under_tensor_parallelism(tmp_path, vocab_tokenizer, family):
    """Rank 0 encodes; the rows, how far each row sees (Gemma 3's images) and their 3-D
    positions (Qwen2.5-VL's) travel to the other rank with the step."""
    if family == "gemma3":
        directory = make_gemma3(str(tmp_path / family), vocab_tokenizer)
        hf = HFGemma3(directory)
    else:
        directory = make_qwen_vl(str(tmp_path / family), vocab_tokenizer, family)
        hf = HFQwenVL(directory)
    prompts = _prompts(hf, vocab_tokenizer)
    expected = [hf.greedy(ids, images, MAX_NEW) for ids, images in prompts]
    with LLM(directory, tensor_parallel_size=2, **ENGINE) as llm:
        _check(_generate(llm, prompts), expected)


def test_llm_chat_reads_image_url_parts(llava, vocab_tokenizer, tmp_path):
    """vLLM's offline LLM.chat with OpenAI's image parts: a data: URL and a local file give
    the server's prompt and transformers' answer; vLLM's image_pil part of the same picture
    gives the same."""
    import base64

    from image_support import png_bytes

    directory, hf = llava
    path = tmp_path / "picture.png"
    path.write_bytes(png_bytes(drawn_image(4)))
    url = "data:image/png;base64," + base64.b64encode(png_bytes(drawn_image(0))).decode()
    messages = [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": "and"}, {"type": "image_url", "image_url": str(path)},
        {"type": "text", "text": "compare them"}]}]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=0)
    with LLM(directory, **ENGINE) as llm:
        out = llm.chat(messages, params)[0]
        as_pil = [{**messages[0], "content": [{"type": "image_pil", "image_pil": drawn_image(0)},
                                              *messages[0]["content"][1:]]}]
        assert llm.chat(as_pil, params)[0].outputs[0].token_ids == out.outputs[0].token_ids
        with pytest.raises(ValueError, match="cannot read /nonexistent.png"):
            llm.chat([{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "file:///nonexistent.png"}}]}])
    template = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "and"},
                                             {"type": "image"},
                                             {"type": "text", "text": "compare them"}]}]
    text = hf.tokenizer.apply_chat_template(template, add_generation_prompt=True,
                                            tokenize=False)
    ids = hf.tokenizer.encode(hf.written(text), add_special_tokens=False)
    _check([out.outputs[0]], [hf.greedy(ids, [drawn_image(0), drawn_image(4)], MAX_NEW,
                                        expanded=hf.writes_text)])


def test_a_step_encodes_its_images_a_batch_at_a_time_and_each_once():
    """Twenty images in one step go through the encoder ENCODE_BATCH at a time; an image
    whose rows are at hand, or outside the step's tokens, is not encoded."""
    from types import SimpleNamespace

    from tokenmill.engine.core.images import ENCODE_BATCH, PromptImages

    batches = []

    def encode(pixels, sizes):
        batches.append(len(pixels))
        return [p.flatten()[:2].repeat(2, 1) for p in pixels]  # 2 rows per image

    images = PromptImages(lambda image: (image, None), ImageTokens(9, 9, 2), "", "",
                          encode=encode, rows_on_host=True)
    pictures = [ImageInput.of(torch.full((3, 1, 1), float(i)), 2) for i in range(20)]
    _, spans = images.place([9] * 20 + [1, 2], pictures)
    spans[3].rows = torch.zeros(2, 2)  # already encoded
    seq = SimpleNamespace(images=spans, num_computed_tokens=0)
    images.encode_for_step([(seq, 30)])  # positions 0..29: the first 15 images
    assert batches == [ENCODE_BATCH, 14 - ENCODE_BATCH]
    assert [s.rows is not None for s in spans] == [True] * 15 + [False] * 5
    assert spans[5].rows[0].tolist() == [5.0, 5.0]  # each image's own rows
    PromptImages.release_computed(spans, 30)
    assert all(s.rows is None for s in spans)


def test_an_image_broken_into_lines_is_written_and_read_line_by_line():
    """Mistral 3's layout: each line of row tokens ends with [IMG_BREAK], the last with
    [IMG_END]; each line is a run whose rows follow the previous line's."""
    tokens = ImageTokens(7, 7, 0, line_end=8, image_end=9)
    image = ImageInput.of(torch.zeros(3, 2, 2), rows=6, line=3)
    ids, spans = place_images([1, 7, 2], [image], tokens)
    assert ids == [1, 7, 7, 7, 8, 7, 7, 7, 9, 2]
    assert [(s.offset, s.length, s.first_row) for s in spans] == [(1, 3, 0), (5, 3, 3)]
    again, _ = place_images(ids, [image], tokens)  # already written out
    assert again == ids


def test_qwen_image_rows_take_the_3d_positions_transformers_gives_them():
    """Qwen2-VL's M-RoPE: each token's (frame, row, column) rotary positions, step by step in
    chunks that cut the images, equal transformers' get_rope_index on the whole prompt, and
    a token after the prompt is shifted by its rope delta."""
    import transformers

    from tokenmill.engine.core.request import RequestTimings, Sequence
    from tokenmill.engine.core.step_builder import build_step_inputs

    config = transformers.Qwen2VLConfig(
        text_config=dict(vocab_size=64, hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1),
        vision_config=dict(depth=1, embed_dim=16, hidden_size=16, num_heads=2,
                           spatial_merge_size=2), image_token_id=9)
    grids = [(1, 6, 8), (1, 8, 2), (1, 4, 4)]  # patch grids: rows 3 x 4, 4 x 1, 2 x 2
    images = [ImageInput.of(torch.full((t * h * w, 4), float(i)), t * h * w // 4,
                            (t, h, w), grid=(t, h // 2, w // 2))
              for i, (t, h, w) in enumerate(grids)]
    ids, spans = place_images([5, 6, 9, 7, 9, 8, 9, 8, 8], images, ImageTokens(9, 9, 0))
    expected, delta = transformers.Qwen2VLModel(config).get_rope_index(
        torch.tensor([ids]), (torch.tensor([ids]) == 9).int(),
        image_grid_thw=torch.tensor(grids))
    seq = Sequence(1, "r", 0, ids, SamplingParams(), None, None, RequestTimings())
    seq.images, seq.block_table = spans, list(range(8))
    for span in spans:  # as if encoded
        span.rows = torch.zeros(span.length, 4)
    got = []
    for start in range(0, len(ids), 5):
        seq.num_computed_tokens = start
        step = build_step_inputs([(seq, min(5, len(ids) - start))], block_size=8)
        got += zip(*step.grid_positions, strict=True) if step.grid_positions else \
            [(p, p, p) for p in step.positions]
    assert got == [tuple(p) for p in expected[:, 0].t().tolist()]
    seq.num_computed_tokens = len(ids) - 1  # the last text token, as a decode step feeds it
    step = build_step_inputs([(seq, 1)], block_size=8)
    assert step.positions == [len(ids) - 1 + int(delta)] and not step.grid_positions


def test_mm_processor_kwargs_set_the_image_processor(tmp_path, vocab_tokenizer):
    """--mm-processor-kwargs (vLLM's): Qwen-VL's max_pixels shrinks an image's rows, and the
    answer is transformers' with its processor set alike, whether set for the engine or by
    one request; a key the processor has no setting for, or one asking what is not read, is
    refused at start naming the option (in a request: a RequestError naming it)."""
    import transformers

    directory = make_qwen_vl(str(tmp_path / "qwen"), vocab_tokenizer)
    hf = HFQwenVL(directory)
    prompt = _prompts(hf, vocab_tokenizer)[0]
    full = len(hf.expand_images(*prompt))
    hf.processor = transformers.AutoImageProcessor.from_pretrained(directory, max_pixels=28 * 42)
    expected = hf.greedy(*prompt, MAX_NEW)
    with LLM(directory, mm_processor_kwargs='{"max_pixels": 1176}', **ENGINE) as llm:
        out = llm.generate([_request(*prompt)], SamplingParams(
            temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=0))[0]
    _check([out.outputs[0]], [expected])
    assert len(out.prompt_token_ids) == len(hf.expand_images(*prompt)) < full
    # A request's own settings (vLLM's prompt key), over the server-wide ones.
    with LLM(directory, **ENGINE) as llm:
        own = llm.generate([{**_request(*prompt), "mm_processor_kwargs": {"max_pixels": 1176}}],
                           SamplingParams(temperature=0.0, max_tokens=MAX_NEW,
                                          ignore_eos=True, logprobs=0))[0]
        with pytest.raises(RequestError, match="mm_processor_kwargs: max_pixel: not a setting"):
            llm.generate([{**_request(*prompt), "mm_processor_kwargs": {"max_pixel": 1}}])
        assert llm.engine.num_waiting == 0
        for geometry in ({"patch_size": 14}, {"merge_size": 1}, {"temporal_patch_size": 1}):
            with pytest.raises(RequestError, match="sets the shape of what the vision encoder"):
                llm.generate([{**_request(*prompt), "mm_processor_kwargs": geometry}])
    _check([own.outputs[0]], [expected])
    with pytest.raises(ConfigError, match="mm_processor_kwargs.*max_pixel: not a setting"):
        LLM(directory, mm_processor_kwargs={"max_pixel": 100}, **ENGINE)
    with pytest.raises(ConfigError, match="mm_processor_kwargs.*not valid JSON"):
        LLM(directory, mm_processor_kwargs="max_pixels=100", **ENGINE)
    gemma = make_gemma3(str(tmp_path / "gemma3"), vocab_tokenizer)
    with pytest.raises(ConfigError, match="mm_processor_kwargs.*pan-and-scan crops are not read"):
        LLM(gemma, mm_processor_kwargs={"do_pan_and_scan": True}, **ENGINE)
    with pytest.raises(ConfigError, match="size: sets the shape of what the vision encoder"):
        LLM(gemma, mm_processor_kwargs={"size": {"height": 448, "width": 448}}, **ENGINE)


def test_internvl_rows_equal_transformers_image_features(tmp_path, vocab_tokenizer):
    """InternVL's encoder, row for row, against transformers' image features on the same
    tiles: InternViT-6B's q/k norms over every head, its layer scales and the pixel shuffle's
    order of each folded block's channels."""
    from tokenmill.engine.models.images import build_image_encoder
    from tokenmill.engine.models.loader import load_config
    from tokenmill.engine.models.source import ModelSource

    directory = make_internvl(str(tmp_path / "internvl"), vocab_tokenizer)
    hf = HFInternVL(directory)
    pixels = hf.image_inputs([drawn_image(3, (30, 70))])["pixel_values"]
    assert pixels.shape[0] > 2  # several tiles and the thumbnail
    encoder = build_image_encoder(load_config(ModelSource(directory)), ModelSource(directory),
                                  torch.float32, torch.device("cpu"))
    with torch.no_grad():
        expected = hf.model.model.get_image_features(pixel_values=pixels).pooler_output
        got = encoder(pixels)
    assert got.shape == (pixels.shape[0] * 4, expected.shape[-1])
    torch.testing.assert_close(got, expected.flatten(0, 1), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("side", [25, 26, 32])
def test_idefics3_tiles_take_the_positions_of_its_buckets(side):
    """Idefics 3 finds a whole tile's position rows by bucketing fractional coordinates, which
    float rounding moves off the patch index for some sides (25): the engine's rows are
    transformers' for each."""
    import transformers
    from transformers.models.idefics3.modeling_idefics3 import Idefics3VisionEmbeddings

    from tokenmill.engine.models.idefics3_images import bucketed_positions

    assert bucketed_positions(25).tolist() != list(range(25 * 25))
    embeddings = Idefics3VisionEmbeddings(transformers.Idefics3VisionConfig(
        hidden_size=4, image_size=2 * side, patch_size=2))
    with torch.no_grad():  # each position row holds its own index
        embeddings.patch_embedding.weight.zero_()
        embeddings.patch_embedding.bias.zero_()
        embeddings.position_embedding.weight[:, 0] = torch.arange(side * side).float()
        out = embeddings(torch.zeros(1, 3, 2 * side, 2 * side),
                         torch.ones(1, side, side, dtype=torch.bool))
    assert out[0, :, 0].long().tolist() == bucketed_positions(side).tolist()


def test_images_as_arrays_read_as_their_pil_images(tmp_path, vocab_tokenizer):
    """vLLM's offline API takes an image as a PIL image or an array of height x width x
    channels uint8 pixels (numpy or torch): the same pixels give the same answer; an array
    that is no image is refused, naming why."""
    import numpy as np

    directory = make_llava(str(tmp_path / "llava"), vocab_tokenizer)
    ids = _prompts(HFLlava(directory), vocab_tokenizer)[0][0]
    image = drawn_image(0)
    pixels = np.asarray(image)
    with LLM(directory, **ENGINE) as llm:
        outputs = _generate(llm, [(ids, [image]), (ids, [pixels]),
                                  (ids, [torch.from_numpy(pixels.copy())])])
        assert outputs[0].token_ids == outputs[1].token_ids == outputs[2].token_ids
        for other in outputs[1:]:  # equal but for float32's last bits: the rows are batched
            for step, same in zip(outputs[0].logprobs, other.logprobs, strict=True):
                assert step == pytest.approx(same, rel=1e-5)
        with pytest.raises(RequestError, match="uint8 pixels, not float32"):
            llm.generate([_request(ids, [pixels.astype(np.float32)])])
        with pytest.raises(RequestError, match="height x width x channels.*shape \\(4,\\)"):
            llm.generate([_request(ids, [np.zeros(4, dtype=np.uint8)])])


@pytest.mark.parametrize("family,rows", [
    ("qwen2_vl", 8 * 10 // 4),  # 56 x 70 pixels at most: 8 x 10 patches, merged 2 x 2
    ("llava_next", None),       # its largest grid resolution
    ("internvl", 4 * 5),        # 4 tiles and the thumbnail, 4 rows each
    ("idefics3", 4 * 5)])       # a 2 x 2 grid of tiles and the whole, 4 rows each
def test_the_largest_image_makes_the_most_rows(tmp_path, vocab_tokenizer, family, rows):
    """The KV pool's profile (on CUDA) encodes ENCODE_BATCH of the largest image the
    processor makes: no image the processor prepares takes more rows, and it encodes."""
    from tokenmill.engine.core.images import ENCODE_BATCH
    from tokenmill.engine.models.images import batches_images

    directory = FAMILIES[family][0](str(tmp_path / family), vocab_tokenizer)
    with LLM(directory, **ENGINE) as llm:
        batch = llm.engine.images.largest_batch()
        others = llm.engine.prepare_images([drawn_image(seed, size) for seed, size in enumerate(
            [(40, 52), (60, 20), (20, 90), (200, 300), (300, 200), (14, 14)])])
        largest = batch[0].rows
        assert len(batch) == ENCODE_BATCH and all(image is batch[0] for image in batch)
        assert largest >= max(image.rows for image in others)
        if rows is not None:
            assert largest == rows
        # What the profile encodes, as the profile's call does: ENCODE_BATCH rows of each.
        encoded = llm.engine.runner.encode_images(*llm.engine._largest_images())
        assert [r.shape[0] for r in encoded] == [largest] * ENCODE_BATCH
        # Each family here encodes one image at a time: the profile encodes one of them.
        assert not batches_images(llm.engine.runner.image_encoder)
