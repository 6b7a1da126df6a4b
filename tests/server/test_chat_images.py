"""Images over HTTP, as the openai client sends them (image_url parts: data: URLs, http(s)
URLs, file:// under --allowed-local-media-path): the reply equals transformers' LLaVA on the
same image, streamed or not; what cannot be read is a 400 naming the messages, and the
server goes on serving."""

from __future__ import annotations

import base64
import functools
import http.server
import threading

import httpx
import openai
import pytest
from image_support import (
    IMAGE_TOKEN,
    HFGemma3,
    HFLlava,
    HFQwenVL,
    drawn_image,
    llava_tokenizer,
    make_gemma3,
    make_llava,
    make_qwen_vl,
    png_bytes,
)
from server_support import in_process_server

MAX_NEW = 6


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory, vocab_tokenizer):
    return make_llava(str(tmp_path_factory.mktemp("llava")), vocab_tokenizer)


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("media")
    (directory / "cat.png").write_bytes(png_bytes(drawn_image(3)))
    (directory / "notes.txt").write_text("not an image")
    return directory


@pytest.fixture(scope="module")
def server(llava_dir, media_dir):
    options = {"allowed_local_media_path": str(media_dir)}
    with in_process_server(llava_dir, "llava", options=options, block_size=8,
                           dtype="float32", limit_mm_per_prompt={"image": 2}) as server:
        yield server


@pytest.fixture(scope="module")
def web(media_dir):
    """A plain HTTP server of the media directory."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(media_dir))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def _data_url(image) -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(image)).decode()


def _ask(client, *urls: str, stream: bool = False, text: str = "What is in the picture?"):
    content = [{"type": "text", "text": text}] + [
        {"type": "image_url", "image_url": {"url": url}} for url in urls]
    return client.chat.completions.create(
        model="llava", temperature=0, max_tokens=MAX_NEW, stream=stream,
        extra_body={"ignore_eos": True},
        messages=[{"role": "user", "content": content}])


def _expected(llava_dir, vocab_tokenizer, images, text: str = "What is in the picture?"):
    """transformers' LLaVA on the prompt the chat template renders, decoded."""
    tokenizer = llava_tokenizer(vocab_tokenizer)
    content = [{"type": "text", "text": text}] + [{"type": "image"} for _ in images]
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": content}],
                                             add_generation_prompt=True, tokenize=False)
    assert rendered.count(IMAGE_TOKEN) == len(images)
    ids = tokenizer.encode(rendered, add_special_tokens=False)
    tokens, _ = HFLlava(llava_dir).greedy(ids, images, MAX_NEW)
    return tokenizer.decode(tokens, skip_special_tokens=True), len(HFLlava(llava_dir).expand(ids))


def test_a_data_url_image_is_read(server, llava_dir, vocab_tokenizer):
    expected, prompt_tokens = _expected(llava_dir, vocab_tokenizer, [drawn_image(0)])
    reply = _ask(server.client, _data_url(drawn_image(0)))
    assert reply.choices[0].message.content == expected
    assert reply.usage.prompt_tokens == prompt_tokens  # the image's 16 rows counted
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in
                       _ask(server.client, _data_url(drawn_image(0)), stream=True)
                       if chunk.choices)
    assert streamed == expected
    other = _ask(server.client, _data_url(drawn_image(1)))
    assert other.choices[0].message.content == _expected(llava_dir, vocab_tokenizer,
                                                         [drawn_image(1)])[0]


def test_the_responses_api_reads_input_images(server, llava_dir, vocab_tokenizer):
    response = server.client.responses.create(
        model="llava", temperature=0, max_output_tokens=MAX_NEW,
        extra_body={"ignore_eos": True},
        input=[{"role": "user", "content": [
            {"type": "input_text", "text": "What is in the picture?"},
            {"type": "input_image", "image_url": _data_url(drawn_image(1))}]}])
    assert response.output_text == _expected(llava_dir, vocab_tokenizer, [drawn_image(1)])[0]


def test_http_and_local_file_images_are_read(server, web, llava_dir, vocab_tokenizer):
    expected, _ = _expected(llava_dir, vocab_tokenizer, [drawn_image(3), drawn_image(0)])
    for url in (f"{web}/cat.png", f"file://{server.state.options.allowed_local_media_path}"
                                  "/cat.png"):
        reply = _ask(server.client, url, _data_url(drawn_image(0)))
        assert reply.choices[0].message.content == expected


def _bad(client, *urls: str) -> dict:
    with pytest.raises(openai.BadRequestError) as info:
        _ask(client, *urls)
    error = info.value.body
    assert error["param"] == "messages"
    return error


@pytest.mark.parametrize("url,message", [
    ("data:image/png;base64,@@@", "image 0: the data URL is not valid base64"),
    ("data:image/png,plain", "image 0: a data URL must be data:<type>;base64,<data>"),
    ("data:image/png;base64," + base64.b64encode(b"not a png").decode(),
     "image 0 is not an image PIL can read"),
    ("ftp://example.com/cat.png", "image 0: the URL must be http(s)://, data: or file://"),
    ("file:///etc/passwd", "is outside --allowed-local-media-path"),
])
def test_an_image_that_cannot_be_read_is_a_400(server, url, message):
    said = _bad(server.client, url)["message"]
    assert message in said
    assert " at 0x" not in said  # no Python object's address


def test_images_are_fetched_only_from_the_allowed_domains(server, web):
    options = server.state.options
    options.allowed_media_domains = ("images.example",)
    try:
        error = _bad(server.client, f"{web}/cat.png")
    finally:
        options.allowed_media_domains = None
    assert "image 0: 127.0.0.1 is not one of --allowed-media-domains" in error["message"]
    options.allowed_media_domains = ("127.0.0.1",)
    try:
        assert _ask(server.client, f"{web}/cat.png").choices[0].finish_reason == "length"
    finally:
        options.allowed_media_domains = None


def test_fetch_failures_and_limits_are_400s(server, web, media_dir):
    assert "answered HTTP 404" in _bad(server.client, f"{web}/missing.png")["message"]
    assert "is not an image PIL can read" in _bad(
        server.client, f"file://{media_dir}/notes.txt")["message"]
    assert "at most 2 per prompt (--limit-mm-per-prompt)" in _bad(
        server.client, *[_data_url(drawn_image(i)) for i in range(3)])["message"]
    # The server goes on answering.
    assert _ask(server.client, _data_url(drawn_image(0))).choices[0].finish_reason == "length"


def test_tokenize_counts_an_images_rows_as_the_chat_completion_does(server):
    content = [{"type": "text", "text": "What is in the picture?"},
               {"type": "image_url", "image_url": {"url": _data_url(drawn_image(0))}}]
    messages = [{"role": "user", "content": content}]
    counted = httpx.post(server.url + "/tokenize", timeout=60, json={
        "model": "llava", "messages": messages, "add_generation_prompt": True}).json()
    reply = server.client.chat.completions.create(model="llava", max_tokens=1,
                                                  messages=messages)
    assert counted["count"] == reply.usage.prompt_tokens
    content[1]["image_url"]["url"] = "data:image/png;base64,AAAA"
    bad = httpx.post(server.url + "/tokenize", timeout=60, json={
        "model": "llava", "messages": messages})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages"


def test_an_image_of_too_many_pixels_is_a_400_before_it_is_decoded(server):
    """A one-colour PNG of 9000 x 8000 is a few KB; decoded it would be 72 million pixels."""
    from PIL import Image

    bomb = _data_url(Image.new("1", (9000, 8000)))
    assert len(bomb) < 100_000
    assert "an image of 9000 x 8000 pixels; at most 67,108,864" in _bad(
        server.client, bomb)["message"]


@pytest.mark.parametrize("settings", [
    {"crop_size": {"height": 56, "width": 56}}, {"do_center_crop": False, "do_resize": False},
])
def test_processor_settings_that_change_what_the_encoder_reads_are_a_400(server, settings):
    """The encoder reads the shape it was trained on: such a request failed inside the step
    that encoded its image, ending the engine loop for every request."""
    content = [{"type": "text", "text": "What is in the picture?"},
               {"type": "image_url", "image_url": {"url": _data_url(drawn_image(0))}}]
    with pytest.raises(openai.BadRequestError) as info:
        server.client.chat.completions.create(
            model="llava", max_tokens=2, messages=[{"role": "user", "content": content}],
            extra_body={"mm_processor_kwargs": settings})
    assert info.value.body["param"] == "mm_processor_kwargs"
    assert "sets the shape of what the vision encoder reads" in info.value.body["message"]
    assert _ask(server.client, _data_url(drawn_image(0))).choices[0].finish_reason == "length"


def test_a_string_template_gets_the_placeholder_before_the_text(server, llava_dir,
                                                                 vocab_tokenizer):
    state = server.state
    state.options.chat_template_content_format = "string"
    try:
        reply = _ask(server.client, _data_url(drawn_image(0)), text="Describe it.")
    finally:
        state.options.chat_template_content_format = "auto"
    tokenizer = llava_tokenizer(vocab_tokenizer)
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": f"{IMAGE_TOKEN}\nDescribe it."}],
        add_generation_prompt=True, tokenize=False)
    tokens, _ = HFLlava(llava_dir).greedy(tokenizer.encode(rendered, add_special_tokens=False),
                                          [drawn_image(0)], MAX_NEW)
    assert reply.choices[0].message.content == tokenizer.decode(tokens,
                                                                skip_special_tokens=True)


def test_gemma3_reads_images_over_http(tmp_path, vocab_tokenizer):
    """Gemma 3: the template's `<start_of_image>` written out as its processor writes it,
    the image's rows seeing each other both ways."""
    directory = make_gemma3(str(tmp_path / "gemma3"), vocab_tokenizer)
    hf = HFGemma3(directory)
    rendered = hf.tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Name it."}]}],
        add_generation_prompt=True, tokenize=False)
    assert rendered.count("<start_of_image>") == 1
    written = rendered.replace("<start_of_image>", "\n\n<start_of_image>"
                               + "<image_soft_token>" * 4 + "<end_of_image>\n\n")
    ids = hf.tokenizer.encode(written, add_special_tokens=False)
    tokens, _ = hf.greedy(ids, [drawn_image(2)], MAX_NEW, expanded=True)
    with in_process_server(directory, "gemma3", block_size=8, dtype="float32") as server:
        reply = server.client.chat.completions.create(
            model="gemma3", temperature=0, max_tokens=MAX_NEW,
            extra_body={"ignore_eos": True, "return_token_ids": True},
            messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": _data_url(drawn_image(2))}},
                {"type": "text", "text": "Name it."}]}])
    assert reply.prompt_token_ids == ids  # the text written out, then tokenized
    assert reply.choices[0].message.content == hf.tokenizer.decode(tokens,
                                                                   skip_special_tokens=True)


def test_qwen2_5_vl_reads_images_over_http(tmp_path, vocab_tokenizer):
    """Qwen2.5-VL: the template's `<|image_pad|>` between its vision tokens written out once
    per merged row of the image as its processor resizes it; the reply, with the rows at
    their 3-D positions, equals transformers'."""
    directory = make_qwen_vl(str(tmp_path / "qwen"), vocab_tokenizer, "qwen2_5_vl")
    hf = HFQwenVL(directory)
    rendered = hf.tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "text", "text": "Name it."}, {"type": "image"}]}],
        add_generation_prompt=True, tokenize=False)
    assert rendered.count("<|vision_start|><|image_pad|><|vision_end|>") == 1
    image = drawn_image(2, (30, 64))
    ids = hf.expand_images(hf.tokenizer.encode(rendered, add_special_tokens=False), [image])
    tokens, _ = hf.greedy(ids, [image], MAX_NEW, expanded=True)
    with in_process_server(directory, "qwen", block_size=8, dtype="float32") as server:
        reply = server.client.chat.completions.create(
            model="qwen", temperature=0, max_tokens=MAX_NEW,
            extra_body={"ignore_eos": True, "return_token_ids": True},
            messages=[{"role": "user", "content": [
                {"type": "text", "text": "Name it."},
                {"type": "image_url", "image_url": {"url": _data_url(image)}}]}])
        smaller = server.client.chat.completions.create(
            model="qwen", max_tokens=1, extra_body={"mm_processor_kwargs": {"max_pixels": 784}},
            messages=[{"role": "user", "content": [
                {"type": "text", "text": "Name it."},
                {"type": "image_url", "image_url": {"url": _data_url(image)}}]}])
        with pytest.raises(openai.BadRequestError) as bad:
            server.client.chat.completions.create(
                model="qwen", max_tokens=1, extra_body={"mm_processor_kwargs": {"pixels": 1}},
                messages=[{"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": _data_url(image)}}]}])
    assert reply.prompt_token_ids == ids and reply.usage.prompt_tokens == len(ids)
    assert reply.choices[0].message.content == hf.tokenizer.decode(tokens,
                                                                   skip_special_tokens=True)
    # A request's own processor settings (vLLM's mm_processor_kwargs): fewer image rows.
    assert smaller.usage.prompt_tokens < len(ids)
    assert bad.value.body["param"] == "mm_processor_kwargs"
    assert "pixels: not a setting" in bad.value.body["message"]
