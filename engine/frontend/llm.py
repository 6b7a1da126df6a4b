"""Offline API: `LLM(model=...).generate(prompts, sampling_params)`, `LLM.chat(messages)`, and
under the pooling runner `LLM.embed(prompts)`, `LLM.classify(prompts)` and
`LLM.score(data_1, data_2)`, with vLLM's argument names."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

from tqdm import tqdm

from tokenmill.engine.contract.config import EngineConfig
from tokenmill.engine.core import (
    BeamSearchOutput,
    BeamSearchParams,
    ClassificationRequestOutput,
    EmbeddingRequestOutput,
    LLMEngine,
    PoolingParams,
    PoolingRequestOutput,
    RequestOutput,
    RequestOutputKind,
    SamplingParams,
    ScoringOutput,
    ScoringRequestOutput,
    cosine_similarity,
    cut_pair_prompt,
    prompt_truncation,
    score_pairs,
)
from tokenmill.engine.core.errors import RequestError
from tokenmill.engine.frontend.beam_search import run_offline
from tokenmill.engine.frontend.content_format import (
    CONTENT_FORMATS,
    detect_content_format,
    in_content_format,
)
from tokenmill.engine.frontend.heap import frozen_heap
from tokenmill.engine.frontend.llm_options import sampling_settings, split_options
from tokenmill.engine.frontend.lora_request import LoRARequest, adapter_names
from tokenmill.engine.frontend.media import read_image_url

Prompt = str | list[int]
# vLLM's prompt with images: {"prompt": str} or {"prompt_token_ids": [...]}, and
# "multi_modal_data": {"image": a PIL image or a list of them}; or its prompt given as
# embeddings: {"prompt_embeds": a tensor [tokens, hidden size]}.
PromptDict = dict[str, Any]
Message = dict[str, Any]


class LLM:
    """Generate for a list of prompts at once; continuous batching does the rest.

    Options are EngineConfig's (vLLM names): LLM(model="smollm2-135m-instruct", max_num_seqs=64),
    and vLLM's others (llm_options.py): those that change nothing here, task and convert (the
    runner), generation_config and override_generation_config (the default sampling).
    """

    def __init__(self, model: str | None = None, show_progress: bool = True, **options: Any):
        if model is not None:
            options["model"] = model
        options, self._defaults = split_options(options)
        self.engine = LLMEngine(EngineConfig(**options), show_progress=show_progress)
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()
        self._content_formats: dict[tuple[str | None, bool], str] = {}

    @property
    def llm_engine(self) -> LLMEngine:
        """vLLM's name of the engine LLM drives (`engine`)."""
        return self.engine

    def get_tokenizer(self) -> Any:
        """The model's tokenizer (vLLM's LLM.get_tokenizer); None under skip_tokenizer_init."""
        return self.tokenizer

    def _text_tokenizer(self, what: str) -> Any:
        """The tokenizer `what` needs; RequestError where skip_tokenizer_init left it out."""
        if self.tokenizer is None:
            raise RequestError(f"{what} needs the tokenizer, which this engine did not load "
                               "(skip_tokenizer_init)")
        return self.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """What `generate` and `chat` sample with when given no SamplingParams, as vLLM's:
        the settings the model's generation_config.json recommends (temperature, top_p,
        top_k, min_p, repetition_penalty; max_new_tokens as max_tokens; none under
        generation_config="vllm"), with override_generation_config's over them, else the
        API's defaults."""
        return SamplingParams(**sampling_settings(self._defaults,
                                                  self.engine.generation_defaults))

    def reset_prefix_cache(self) -> bool:
        """vLLM's: forget every cached prefix; False while a request is unfinished."""
        return self.engine.reset_prefix_cache()

    def sleep(self, level: int = 1) -> None:
        """vLLM's sleep mode (enable_sleep_mode=True): the weights to host memory (level 1) or
        freed (level 2, read from the checkpoint again when woken) and the KV cache freed
        until wake_up (LLMEngine.sleep)."""
        self.engine.sleep(level)

    def load_weights(self, weights: Any) -> None:
        """Copy (name, tensor) pairs under their Hugging Face names (a trainer's
        `model.named_parameters()` or state dict items, whole or in part) into the running
        model, in place (LLMEngine.load_weights)."""
        self.engine.load_weights(weights)

    def reload_weights(self, path: str | None = None) -> None:
        """Read a checkpoint of the same shapes (a trainer's new weights; None: the model's
        own) into the running model, in place (LLMEngine.reload_weights)."""
        self.engine.reload_weights(path)

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Back from sleep: "weights", "kv_cache" or both (the default)."""
        self.engine.wake_up(tags)

    def shutdown(self) -> None:
        """End the tensor-parallel worker processes (if any); also runs at interpreter exit."""
        self.engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def generate(self, prompts: Prompt | PromptDict | Sequence[Prompt | PromptDict],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = False,
                 lora: str | Sequence[str | None] | None = None,
                 priority: Sequence[int] | None = None,
                 lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
                 ) -> list[RequestOutput]:
        """Results come back in input order. A prompt is a string or a list of token ids, or
        vLLM's dict of either with `multi_modal_data`'s images (the model's image placeholder
        token in the prompt, once per image), or its {"prompt_embeds": tensor} (needs
        enable_prompt_embeds).
        `lora` names the LoRA adapter of every prompt, or gives one per prompt (None: the base
        model). `priority` gives one per prompt (lower first; needs
        scheduling_policy="priority"), as vLLM's LLM.generate takes it. `lora_request` (vLLM's
        LoRARequest, or one per prompt) in place of `lora`: an adapter not yet loaded is
        loaded first, under its name.

        Every prompt is checked before any runs: one bad prompt raises and none is queued.
        """
        pairs = [self._with_images(prompt) for prompt in _as_prompt_list(prompts)]
        batch, images = [prompt for prompt, _ in pairs], [pics for _, pics in pairs]
        params_list = _as_params_list(sampling_params or self.get_default_sampling_params(),
                                      len(batch))
        loras = self._adapters(lora, lora_request, len(batch))
        priorities = [0] * len(batch) if priority is None else list(priority)
        if len(priorities) != len(batch):
            raise ValueError(f"{len(priorities)} priorities for {len(batch)} prompts")
        for prompt, p, name, rank, pictures in zip(batch, params_list, loras, priorities, images,
                                                   strict=True):
            self.engine.check_priority(rank)
            self.engine.check_request(prompt, p, name, images=pictures)
        ids = [f"offline-{next(self._ids)}" for _ in batch]
        for request_id, prompt, p, name, rank, pictures in zip(
                ids, batch, params_list, loras, priorities, images, strict=True):
            # Only the finished outputs are read: the engine need not build the others.
            p = dataclasses.replace(p, output_kind=RequestOutputKind.FINAL_ONLY)
            self.engine.add_request(request_id, prompt, p, lora_name=name, priority=rank,
                                    images=pictures)
        return self._run(ids, "Generating", use_tqdm)

    def beam_search(self, prompts: Prompt | PromptDict | Sequence[Prompt | PromptDict],
                    params: BeamSearchParams, use_tqdm: bool = False,
                    lora: str | None = None,
                    lora_request: LoRARequest | None = None) -> list[BeamSearchOutput]:
        """Beam search for each prompt, as vLLM's LLM.beam_search: one BeamSearchOutput per
        prompt, in input order, its `sequences` the best `params.beam_width` hypotheses, best
        first (each one's `tokens` and `text` hold the prompt too). Hugging Face's rules
        (core/beam_search.py); each round of every prompt's beams runs as one batch.
        Every prompt is checked before any runs."""
        batch = []
        for prompt in _as_prompt_list(prompts):
            text, images = self._with_images(prompt)
            if images:
                raise ValueError("beam search takes text prompts; this one carries images")
            batch.append(text)
        [name] = self._adapters(lora, lora_request, 1)
        return run_offline(self, batch, params, use_tqdm, name)

    def _adapters(self, lora: str | Sequence[str | None] | None,
                  lora_request: LoRARequest | Sequence[LoRARequest | None] | None,
                  count: int) -> list[str | None]:
        """Each prompt's adapter name, from `lora` (names) or vLLM's `lora_request`."""
        if lora_request is None:
            return _as_lora_list(lora, count)
        if lora is not None:
            raise ValueError("give lora (adapter names) or lora_request, not both")
        return adapter_names(self.engine, lora_request, count)

    def _with_images(self, prompt: Prompt | PromptDict) -> tuple[Prompt, list[Any] | None]:
        """A prompt and its images, prepared once (a dict prompt's multi_modal_data)."""
        if not isinstance(prompt, dict):
            return prompt, None
        if "prompt_embeds" in prompt:  # vLLM's EmbedsPrompt
            others = sorted(set(prompt) - {"prompt_embeds"})
            if others:
                raise ValueError(f"a prompt given as embeddings takes nothing beside it, got "
                                 f"{others}")
            # Checked and converted once, for the check and the request alike.
            return self.engine.prepare_prompt_embeds(prompt["prompt_embeds"]), None
        data = dict(prompt.get("multi_modal_data") or {})
        image = data.pop("image", None)
        if data:
            raise ValueError(f"multi_modal_data: {sorted(data)} not supported; images only")
        text = prompt.get("prompt_token_ids", prompt.get("prompt"))
        if text is None:
            raise ValueError("a dict prompt needs 'prompt' or 'prompt_token_ids'")
        if image is None:
            return text, None
        return text, self.engine.prepare_images(image if isinstance(image, list) else [image],
                                                prompt.get("mm_processor_kwargs"))

    def embed(self, prompts: Prompt | Sequence[Prompt],
              pooling_params: PoolingParams | None = None,
              use_tqdm: bool = False,
              truncate_prompt_tokens: int | None = None) -> list[EmbeddingRequestOutput]:
        """Embed each prompt (the pooling runner), in input order; each result's
        `outputs.embedding` is its vector, as vLLM's LLM.embed returns. Every prompt is
        checked before any runs. `truncate_prompt_tokens` (vLLM's) embeds each prompt's last
        k tokens (-1: the context length), within its special tokens."""
        batch = self._truncated(_as_prompt_list(prompts), truncate_prompt_tokens)
        params = pooling_params or PoolingParams()
        return [EmbeddingRequestOutput.of(out) for out in self._pool(batch, params, use_tqdm)]

    def encode(self, prompts: Prompt | Sequence[Prompt],
               pooling_params: PoolingParams | None = None,
               use_tqdm: bool = False,
               truncate_prompt_tokens: int | None = None) -> list[PoolingRequestOutput]:
        """Each prompt's pooled output, whatever the model pools for, in input order: as
        vLLM's LLM.encode, `outputs.data` is an embedding model's vector (as `embed` gives
        it) or a classifier's probabilities (as `classify`)."""
        params = dataclasses.replace(pooling_params or PoolingParams(), task=self.engine.task)
        batch = self._truncated(_as_prompt_list(prompts), truncate_prompt_tokens)
        return [PoolingRequestOutput.of(out) for out in self._pool(batch, params, use_tqdm)]

    def classify(self, prompts: Prompt | Sequence[Prompt], use_tqdm: bool = False,
                 pooling_params: PoolingParams | None = None,
                 truncate_prompt_tokens: int | None = None,
                 ) -> list[ClassificationRequestOutput]:
        """Classify each prompt (a sequence classifier, the pooling runner), in input order;
        each result's `outputs.probs` holds one probability per label, as vLLM's
        LLM.classify returns (the logits with PoolingParams(use_activation=False))."""
        params = dataclasses.replace(pooling_params or PoolingParams(), task="classify")
        batch = self._truncated(_as_prompt_list(prompts), truncate_prompt_tokens)
        return [ClassificationRequestOutput.of(out)
                for out in self._pool(batch, params, use_tqdm)]

    def _truncated(self, batch: list[Prompt], keep: int | None) -> list[Prompt]:
        """Each prompt's last `keep` tokens (vLLM's truncate_prompt_tokens; None: whole)."""
        _check_keep(keep)
        if keep is None:
            return batch
        return [prompt_truncation.truncated(
            self._text_tokenizer("a text prompt").encode(p) if isinstance(p, str) else list(p),
            keep, self.tokenizer, self.engine.max_model_len) for p in batch]

    def score(self, data_1: str | Sequence[str], data_2: str | Sequence[str],
              use_tqdm: bool = False,
              pooling_params: PoolingParams | None = None,
              truncate_prompt_tokens: int | None = None) -> list[ScoringRequestOutput]:
        """Score text pairs, as vLLM's LLM.score: one text against each of a list, or two
        lists pair by pair. A cross-encoder (a one-label classifier) reads each pair as one
        prompt and scores its probability; an embedding model embeds each text once and
        scores the cosine similarity of the two vectors. `truncate_prompt_tokens` cuts a
        cross-encoder's pair as its tokenizer cuts one (each text from the left), and each
        text an embedding model embeds, as the server's score API does."""
        self._text_tokenizer("scoring text pairs")
        _check_keep(truncate_prompt_tokens)
        pairs = score_pairs(data_1, data_2)
        if self.engine.task == "classify":
            classifier = self.engine.pooler.classifier
            if len(classifier.labels) != 1:
                raise ValueError(f"scoring needs a classifier with one label; this one has "
                                 f"{len(classifier.labels)}: use LLM.classify")
            params = dataclasses.replace(pooling_params or PoolingParams(), task="classify")
            encoded = [cut_pair_prompt(self.tokenizer, a, b, classifier, truncate_prompt_tokens,
                                       self.engine.max_model_len) for a, b in pairs]
            outs = self._pool([ids for ids, _ in encoded], [
                dataclasses.replace(params, token_type_ids=types) for _, types in encoded],
                use_tqdm)
            return [ScoringRequestOutput(out.request_id, out.prompt_token_ids,
                                         ScoringOutput(out.embedding[0])) for out in outs]
        texts = list(dict.fromkeys(text for pair in pairs for text in pair))
        vectors = dict(zip(texts, self._pool(self._truncated(texts, truncate_prompt_tokens),
                                             PoolingParams(), use_tqdm), strict=True))
        return [ScoringRequestOutput(
            f"score-{i}", vectors[a].prompt_token_ids + vectors[b].prompt_token_ids,
            ScoringOutput(cosine_similarity(vectors[a].embedding, vectors[b].embedding)))
            for i, (a, b) in enumerate(pairs)]

    def _pool(self, batch: list[Prompt], params: PoolingParams | list[PoolingParams],
              use_tqdm: bool) -> list[RequestOutput]:
        """Every prompt through the pooling runner (with its own params where a list gives
        them), checked before any runs."""
        each = params if isinstance(params, list) else [params] * len(batch)
        for prompt, p in zip(batch, each, strict=True):
            self.engine.check_request(prompt, None, pooling=p)
        ids = [f"offline-{next(self._ids)}" for _ in batch]
        for request_id, prompt, p in zip(ids, batch, each, strict=True):
            self.engine.add_request(request_id, prompt, pooling=p)
        return self._run(ids, "Pooling", use_tqdm)

    def _run(self, ids: list[str], what: str, use_tqdm: bool) -> list[RequestOutput]:
        """Step the engine until every request of `ids` has finished; their outputs in that
        order. On an error, what is left of them is aborted."""
        done: dict[str, RequestOutput] = {}
        with tqdm(total=len(ids), desc=what, disable=not use_tqdm) as bar, frozen_heap():
            try:
                while len(done) < len(ids):
                    for out in self.engine.step():
                        if out.finished:
                            done[out.request_id] = out
                            bar.update(1)
            except BaseException:
                for request_id in ids:
                    if request_id not in done:
                        self.engine.abort_request(request_id)
                raise
        return [done[i] for i in ids]

    def chat(self, messages: list[Message] | list[list[Message]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
             use_tqdm: bool = False, *, chat_template: str | None = None,
             add_generation_prompt: bool = True, continue_final_message: bool = False,
             tools: list[dict] | None = None,
             chat_template_kwargs: dict[str, Any] | None = None,
             mm_processor_kwargs: dict[str, Any] | None = None,
             lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
             chat_template_content_format: str = "auto",
             ) -> list[RequestOutput]:
        """Apply the chat template (the model's, or `chat_template`), then generate; the
        keywords are vLLM's LLM.chat's (chat_template_kwargs: the template's own variables,
        e.g. Qwen3's enable_thinking; mm_processor_kwargs: the image processor's settings for
        these images). A message's OpenAI `image_url` parts (data:, http(s) or file URLs, or
        local paths) and vLLM's `image_pil` parts (a PIL image) are read and reach the
        template as {"type": "image"} parts, for a model that reads images. A message's
        content reaches the template in the form it reads (vLLM's
        chat_template_content_format: "string", "openai" parts, or "auto", which asks the
        template), so OpenAI's list of text parts renders on a template that prints strings."""
        self._text_tokenizer("a chat")
        if chat_template_content_format not in CONTENT_FORMATS:
            raise ValueError(f"chat_template_content_format: {chat_template_content_format!r} "
                             f"is not one of {', '.join(CONTENT_FORMATS)}")
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        placeholder = (None if self.engine.images is None else
                       self.tokenizer.convert_ids_to_tokens(self.engine.images.placeholder))
        prompts: list[Prompt | PromptDict] = []
        for conversation in conversations:
            pictures = [_part_image(part) for part in _parts(conversation)
                        if part.get("type") in IMAGE_PARTS]
            form = chat_template_content_format
            if form == "auto":
                form = self._content_format(chat_template, bool(pictures))
            text = self.apply_chat_template(
                in_content_format(_template_messages(conversation), form, placeholder),
                chat_template=chat_template,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message, tools=tools,
                chat_template_kwargs=chat_template_kwargs, tokenize=not pictures)
            if not pictures:
                prompts.append(text)
                continue
            images = self.engine.prepare_images(pictures, mm_processor_kwargs)
            # The template wrote the special tokens; each image marker written out first.
            ids = self.tokenizer.encode(self.engine.images.expand_text(text),
                                        add_special_tokens=False)
            prompts.append({"prompt_token_ids": ids, "multi_modal_data": {"image": images}})
        return self.generate(prompts, sampling_params, use_tqdm, lora_request=lora_request)

    def _content_format(self, chat_template: str | None, images: bool) -> str:
        """The form the template reads a message's content in, asked once per template."""
        key = (chat_template, images)
        if key not in self._content_formats:
            self._content_formats[key] = detect_content_format(self.tokenizer, chat_template,
                                                               images)
        return self._content_formats[key]

    def apply_chat_template(self, messages: list[Message], *, chat_template: str | None = None,
                            add_generation_prompt: bool = True,
                            continue_final_message: bool = False,
                            tools: list[dict] | None = None,
                            chat_template_kwargs: dict[str, Any] | None = None,
                            tokenize: bool = True) -> list[int] | str:
        ids = self.tokenizer.apply_chat_template(
            messages, chat_template=chat_template, add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message, tools=tools, tokenize=tokenize,
            **(chat_template_kwargs or {}))
        if not tokenize:
            return ids
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids)


def _parts(conversation: list[Message]) -> list[dict[str, Any]]:
    return [part for message in conversation if isinstance(message.get("content"), list)
            for part in message["content"] if isinstance(part, dict)]


# A message's image parts offline: OpenAI's image_url, vLLM's image_pil.
IMAGE_PARTS = ("image_url", "image_pil")


def _part_image(part: dict[str, Any]) -> Any:
    """The image an image part holds, read (a URL or path) or as it is (a PIL image)."""
    if part["type"] == "image_pil":
        return part["image_pil"]
    url = part["image_url"]
    return read_image_url(url["url"] if isinstance(url, dict) else url)


def _template_messages(conversation: list[Message]) -> list[Message]:
    """The conversation with each image part as the templates of image models read an
    image: {"type": "image"}."""
    def part(p: Any) -> Any:
        return {"type": "image"} if isinstance(p, dict) and p.get("type") in IMAGE_PARTS else p

    return [{**m, "content": [part(p) for p in m["content"]]}
            if isinstance(m.get("content"), list) else m for m in conversation]


def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, dict):
        return [prompts]
    prompts = list(prompts)
    if prompts and all(isinstance(t, int) for t in prompts):
        return [prompts]
    return [p if isinstance(p, str | dict) else list(p) for p in prompts]


def _as_lora_list(lora: str | Sequence[str | None] | None, count: int) -> list[str | None]:
    if lora is None or isinstance(lora, str):
        return [lora] * count
    names = list(lora)
    if len(names) != count:
        raise ValueError(f"got {len(names)} LoRA adapter names for {count} prompts")
    return names


def _check_keep(keep: int | None) -> None:
    if not prompt_truncation.valid_keep(keep):
        raise ValueError(f"truncate_prompt_tokens: {prompt_truncation.KEEP_RULE}, got {keep}")


def _as_params_list(params: SamplingParams | Sequence[SamplingParams],
                    count: int) -> list[SamplingParams]:
    if isinstance(params, SamplingParams):
        return [params] * count
    params = list(params)
    if len(params) != count:
        raise ValueError(f"got {len(params)} SamplingParams for {count} prompts")
    return params
