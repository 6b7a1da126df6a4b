"""LLMEngine: requests in, tokens out, one scheduler step at a time. Knows no HTTP."""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from tokenmill.engine.contract.config import ConfigError, EngineConfig
from tokenmill.engine.contract.model_shape import recurrent_shape_of
from tokenmill.engine.contract.pooling import TASK_LACKS, TASK_SERVED, Pooler
from tokenmill.engine.core.detokenizer import IncrementalDetokenizer
from tokenmill.engine.core.errors import (
    EngineAsleepError,
    LoRAAdapterError,
    RequestError,
    SleepModeError,
    UnknownAdapterError,
)
from tokenmill.engine.core.generation_config import generation_defaults, load_generation_config
from tokenmill.engine.core.images import ImageInput, ImageSpan, PromptImages
from tokenmill.engine.core.kv_cache import KVCacheManager, KVCacheStats
from tokenmill.engine.core.lora_registry import LoRARegistry
from tokenmill.engine.core.lora_slots import LoRARef
from tokenmill.engine.core.output_processor import append_token, delta_due, request_output
from tokenmill.engine.core.outputs import RequestOutput
from tokenmill.engine.core.pooling import SequencePooling, embedding
from tokenmill.engine.core.pooling import record as record_pooled
from tokenmill.engine.core.pooling_params import PoolingParams
from tokenmill.engine.core.prompt_embeds import PromptEmbeds
from tokenmill.engine.core.prompt_logprobs import record as record_prompt_logprobs
from tokenmill.engine.core.prompt_truncation import truncated
from tokenmill.engine.core.request import RequestTimings, Sequence, placeholder
from tokenmill.engine.core.sampler import (
    PendingSample,
    sample,
    sample_later,
    sample_worst_case,
)
from tokenmill.engine.core.sampling_params import RequestOutputKind, SamplingParams
from tokenmill.engine.core.scheduler import Scheduler, SchedulerOutput
from tokenmill.engine.core.speculative.proposer import SpeculationStats
from tokenmill.engine.core.speculative.setup import make_proposer, open_draft
from tokenmill.engine.core.speculative.verify import Draw, verify
from tokenmill.engine.core.step_builder import build_step_inputs
from tokenmill.engine.core.structured import bitmask
from tokenmill.engine.core.structured.backend import GrammarError, StructuredOutputs
from tokenmill.engine.distributed.group import TPGroup
from tokenmill.engine.distributed.sharding import check_tensor_parallel
from tokenmill.engine.execution.cpu_dtype import DTYPES, default_cpu_dtype
from tokenmill.engine.execution.kv_sizing import check_host_memory
from tokenmill.engine.execution.rank import RankSetup, build_runner, rank_device
from tokenmill.engine.execution.recurrent_states import checkpoint_slots
from tokenmill.engine.execution.workers import WorkerFailed, Workers
from tokenmill.engine.layers.attention import check_kv_cache_dtype, resolve_backend
from tokenmill.engine.layers.to_device import list_to_device
from tokenmill.engine.models.architecture import (
    architecture_of,
    classifier_of,
    context_length_of,
    encoder_of,
    flags_of,
    is_bare_decoder,
    sliding_window_of,
)
from tokenmill.engine.models.decoder import prompt_embeds_refusal
from tokenmill.engine.models.gguf_weights import gguf_quantized
from tokenmill.engine.models.images import (
    image_grid,
    image_layout,
    image_processor,
    image_tokens,
    image_writer,
    reads_images,
    reads_several_apart,
)
from tokenmill.engine.models.loader import (
    check_reload,
    check_tokenizer_fits,
    load_config,
    load_tokenizer,
    reload_refusal,
)
from tokenmill.engine.models.pooler_files import embedding_checkpoint, model_pooler
from tokenmill.engine.models.quantize import step_weight_bytes, weight_bytes
from tokenmill.engine.models.source import ModelLoadError, resolve_model, resolve_tokenizer

log = logging.getLogger(__name__)
# Why text is out of reach under --skip-tokenizer-init, in a refusal's words.
NO_TOKENIZER = "this engine did not load (--skip-tokenizer-init)"
# What sleep mode takes off the device, by vLLM's wake_up tags.
SLEEP_TAGS = ("weights", "kv_cache")


@dataclass
class _Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    timings: RequestTimings
    seqs: list[Sequence]
    cache_salt: str | None = None  # the caller's, with the adapter's folded in
    finished: bool = False
    lora: LoRARef | None = None
    images: list[ImageSpan] = dataclasses.field(default_factory=list)
    embeds: PromptEmbeds | None = None  # a prompt given as embeddings


@dataclass
class _PendingStep:
    """A step sampled under async scheduling whose tokens are still on their way back."""

    seqs: list[Sequence]
    sample: PendingSample


class LLMEngine:
    """With --tensor-parallel-size N > 1 this process is rank 0: it schedules, samples and runs
    its own shard; N - 1 worker processes run theirs (engine/distributed/)."""

    def __init__(self, config: EngineConfig, show_progress: bool = True,
                 on_worker_failure: Callable[[str], None] | None = None):
        started = time.perf_counter()
        config.check_supported()
        self.config = config
        self.device = _device(config.device)
        backend = resolve_backend(config.attention_backend, self.device)
        check_kv_cache_dtype(config.kv_cache_dtype, backend, self.device)
        source = resolve_model(config.model, config.download_dir, config.revision,
                               config.hf_config_path, config.ignore_patterns)
        if overrides := config.config_overrides():
            source = dataclasses.replace(source, config_overrides=json.dumps(overrides))
        config_start = time.perf_counter()
        self.model_config = load_config(source)
        # After the config: reading it first refuses a file that is not GGUF, in its words.
        self.dtype = _dtype(config.dtype, self.device, quantized_file=bool(source.gguf_file)
                            and gguf_quantized(source.gguf_path))
        tokenizer_start = time.perf_counter()
        tokenizer = config.tokenizer_source()
        # None under --skip-tokenizer-init: prompts are token ids and replies have no text.
        self.tokenizer = None if config.skip_tokenizer_init else \
            load_tokenizer(resolve_tokenizer(tokenizer, config.download_dir,
                                             config.tokenizer_revision)
                           if tokenizer else source)
        if tokenizer and self.tokenizer is not None:
            check_tokenizer_fits(self.tokenizer, self.model_config, tokenizer)
        # Start-up phases done here; the runner times its own (rank.py).
        self._phase_seconds = {"config": tokenizer_start - config_start,
                               "tokenizer": time.perf_counter() - tokenizer_start}
        self.max_model_len = _max_model_len(config, self.model_config)
        # How embeddings are pooled under the pooling runner; None: this engine generates.
        self.pooler = _pooler(config, self.model_config, source.directory)
        # An encoder's prompts run whole, each in one step, and keep no KV cache.
        self.encoder = encoder_of(self.model_config) is not None
        if self.encoder:
            _check_encoder_options(config)
        if config.enable_lora and flags_of(self.model_config).ungated_mlp:
            raise ConfigError("enable_lora", f"LoRA adapters are not served on "
                              f"{architecture_of(self.model_config)}'s MLP without a gate")
        if config.enable_lora and flags_of(self.model_config).latent_attention:
            raise ConfigError("enable_lora", f"LoRA adapters are not served on "
                              f"{architecture_of(self.model_config)}'s latent attention")
        if recurrent_shape_of(self.model_config):
            _check_linear_attention_options(config, architecture_of(self.model_config))
        tp_size = config.tensor_parallel_size
        if not self.encoder:
            check_tensor_parallel(self.model_config, tp_size)
        _check_devices(config.device, self.device, tp_size)
        check_host_memory(config)
        self.tp = TPGroup()
        self.workers: Workers | None = None
        self._threads = torch.get_num_threads()
        log.info("loading model", extra={"model": config.model, "device": str(self.device),
                                         "dtype": str(self.dtype), "tensor_parallel": tp_size,
                                         "runner": self.runner_kind})
        reads = self.pooler is None and config.image_limit() != 0 and \
            reads_images(self.model_config, source.directory)
        if reads and self.tokenizer is None:
            raise ConfigError("skip_tokenizer_init", f"{architecture_of(self.model_config)} "
                              "reads images, whose prompt tokens its tokenizer and processor "
                              "write; to serve its text alone without a tokenizer, add "
                              "--limit-mm-per-prompt '{\"image\": 0}'")
        setup = RankSetup(config, source, self.device.type, self.dtype, backend,
                          self.max_model_len, pooling=self.pooler is not None,
                          head_token_ids=_head_token_ids(self.pooler, self.tokenizer),
                          images=reads)
        speculative = config.speculative()
        if speculative is not None:
            speculative = speculative.on_device(self.device.type)
        try:
            if tp_size > 1:
                self._start_workers(setup, on_worker_failure)
            # Before the target's pool is sized: on CUDA the profile then counts its weights.
            draft = open_draft(speculative, config, self.model_config, self.tokenizer,
                               self.max_model_len, self.dtype, self.device, backend)
            # How prompts carry images, for a checkpoint that reads them (None: text only);
            # the profile of the KV pool encodes its largest batch of images.
            self.images = self._prompt_images(source.directory) if reads else None
            self._check_prompt_embeds()
            self.runner = build_runner(
                setup, self.model_config, self.device, self.tp, show_progress,
                on_logits=sample_worst_case,
                extra_bytes_per_block=draft.layout.bytes_per_block if draft else 0,
                largest_images=None if self.images is None else self._largest_images)
            self.max_model_len = _fit_pool(config, self.max_model_len, self.runner.num_blocks,
                                           self.device.type)
        except BaseException as exc:
            failure = self.workers.failure if self.workers is not None else None
            self.shutdown()
            if failure is not None and not isinstance(exc, WorkerFailed):
                raise WorkerFailed(failure) from exc
            raise
        if self.workers is not None:
            self.runner.on_step = self.workers.send_step
        if self.images is not None and self.images.tokens.both_ways:
            self._check_whole_images(self.images.per_image)
        self._download_seconds = source.download_seconds
        log.info("model loaded", extra={"model": config.model, **self._load_log_fields()})
        num_blocks = self.runner.num_blocks
        # MEAN and CLS pooling read every prompt token's hidden state: nothing can be skipped.
        recurrent = self.runner.states is not None
        prefix_caching = config.enable_prefix_caching and not self.encoder and (
            self.pooler is None or self.pooler.pooling_type == "LAST")
        # A model with linear-attention layers resumes a cached prefix only where the prefix
        # cache keeps their state (core/kv_cache/state_checkpoints.py).
        self.kv = KVCacheManager(num_blocks, config.block_size, prefix_caching,
                                 layout=self.runner.layout,
                                 num_host_blocks=self.runner.num_host_blocks,
                                 state_slots=config.max_num_seqs if recurrent else 0,
                                 checkpoint_slots=checkpoint_slots(
                                     config.max_num_seqs, prefix_caching,
                                     config.mamba_cache_mode) if recurrent else 0)
        proposer = make_proposer(speculative, draft, num_blocks, self.max_model_len,
                                 config.max_num_batched_tokens)
        self.speculation_stats = proposer.stats if proposer else SpeculationStats()
        self.lora = LoRARegistry(config.max_loras, self.runner.lora.cache.get,
                                 config.download_dir) if config.enable_lora else None
        self.scheduler = Scheduler(self.kv, config.max_num_seqs, self._step_budget(),
                                   proposer, self.lora.slots if self.lora else None,
                                   chunked_prefill=(config.enable_chunked_prefill
                                                    and not self.encoder),
                                   policy=config.scheduling_policy,
                                   long_prefill_token_threshold=(
                                       0 if self.encoder
                                       else config.long_prefill_token_threshold))
        generation_config = load_generation_config(source.directory)  # read once, for both
        self.eos_token_ids = _eos_ids(self.model_config, self.tokenizer, generation_config,
                                      self.model_config.vocab_size)
        self.generation_defaults = generation_defaults(generation_config)
        # Grammars of constrained requests; xgrammar loads on the first one.
        self.structured = StructuredOutputs(self.tokenizer, self.model_config.vocab_size,
                                            self.eos_token_ids)
        # Noise of the sampled requests that bring no seed of their own, drawn in one call.
        self._generator = torch.Generator(device=self.device).manual_seed(config.seed)
        self._seq_ids = itertools.count()
        self._requests: dict[str, _Request] = {}
        self.last_plan: SchedulerOutput | None = None  # the latest step's composition
        # The requests that advanced in the latest step (or the one abort_request just
        # stopped), whatever output they asked for: what a step observer counts, as a
        # FINAL_ONLY request reports nothing until done. Read their request_id,
        # prompt_token_ids, timings and seqs (each sequence's index and output_token_ids).
        self.last_advanced: list[_Request] = []
        self.async_scheduling = config.async_scheduling
        self._pending: _PendingStep | None = None  # async scheduling: tokens not read back
        self._asleep: set[str] = set()  # sleep mode: which of SLEEP_TAGS are off the device
        self._add_startup_loras()
        self._startup_seconds = time.perf_counter() - started
        log.info("engine ready", extra={
            "kv_blocks": num_blocks, "block_size": config.block_size,
            "max_model_len": self.max_model_len,
            **{name: round(seconds, 3) for name, seconds in self.startup_report().items()}})
        log.info("memory", extra=self.memory_report())

    def _check_prompt_embeds(self) -> None:
        """ConfigError, before any weight loads, where --enable-prompt-embeds asks for what
        this model cannot take."""
        if not self.config.enable_prompt_embeds:
            return
        refusal = "a pooling model embeds prompts; it generates from none" \
            if self.pooler is not None else prompt_embeds_refusal(self.model_config)
        if refusal is not None:
            raise ConfigError("enable_prompt_embeds", f"{architecture_of(self.model_config)} "
                              f"cannot take prompts given as embeddings: {refusal}")

    def _prompt_images(self, directory: str) -> PromptImages:
        processor = self._image_processor(directory)
        return PromptImages(
            processor, *image_tokens(self.model_config, self.tokenizer),
            encode=lambda pixels, sizes: self.runner.encode_images(pixels, sizes),
            rows_on_host=self.config.tensor_parallel_size > 1,
            layout_of=image_layout(self.model_config),
            grid_of=image_grid(self.model_config),
            several=processor.several if reads_several_apart(self.model_config) else None,
            writer=image_writer(self.model_config, self.tokenizer))

    def _largest_images(self) -> tuple[list[torch.Tensor], list[Any]]:
        batch = self.images.largest_batch()
        return [image.pixels for image in batch], [image.size for image in batch]

    def _image_processor(self, directory: str) -> Any:
        """The checkpoint's image processor with --mm-processor-kwargs applied (ConfigError
        naming the option for a setting it lacks)."""
        try:
            return image_processor(directory, self.model_config,
                                   self.config.image_processor_options())
        except ModelLoadError:
            self.shutdown()
            raise
        except ValueError as exc:
            self.shutdown()
            raise ConfigError("mm_processor_kwargs", str(exc)) from None

    def _check_whole_images(self, per_image: int) -> None:
        """ConfigError where a step cannot hold one image whose tokens see each other both
        ways (computed in one step)."""
        for option, value in (("max_num_batched_tokens", self.config.max_num_batched_tokens),
                              ("long_prefill_token_threshold",
                               self.config.long_prefill_token_threshold)):
            if value and value < per_image:
                self.shutdown()
                raise ConfigError(option, f"{value} cannot hold one image's {per_image} "
                                          f"tokens, which {self._model_kind()} computes in "
                                          f"one step; raise it to at least {per_image}")

    def _step_budget(self) -> int:
        """The scheduler's tokens per step: --max-num-batched-tokens, raised to the context
        length for an encoder, whose prompts cannot be split (as vLLM sizes the budget without
        chunked prefill)."""
        budget = self.config.max_num_batched_tokens
        if self.encoder and budget < self.max_model_len:
            log.info("step budget raised to the context length", extra={
                "max_num_batched_tokens": budget, "max_model_len": self.max_model_len})
            return self.max_model_len
        return budget

    def _start_workers(self, setup: RankSetup,
                       on_failure: Callable[[str], None] | None) -> None:
        size = self.config.tensor_parallel_size
        threads = max(1, self._threads // size)
        if self.device.type == "cpu":
            torch.set_num_threads(threads)  # N ranks share the cores; restored at shutdown
        else:
            self.device = rank_device(self.device.type, 0)
            torch.cuda.set_device(self.device)
        self.workers = Workers(setup, size, threads, on_failure)
        self.workers.wait_until_joined()
        self.tp = TPGroup.start(self.workers.store, size, self.device)

    def _add_startup_loras(self) -> None:
        for module in self.config.lora_adapters():
            try:
                self.add_lora(module.name, module.path)
            except LoRAAdapterError as exc:
                self.shutdown()
                raise ConfigError("lora_modules", str(exc)) from None

    def shutdown(self) -> None:
        """End the tensor-parallel workers and leave their group; nothing to do on one device.
        Also runs at interpreter exit, so no worker outlives this process."""
        if self.workers is None:
            return
        failed = self.workers.failure is not None
        self.workers.shutdown()
        # After a failure NCCL could block in teardown; gloo (CPU) leaves cleanly.
        if not failed or self.device.type == "cpu":
            self.tp.leave()
        torch.set_num_threads(self._threads)

    # ---- requests -------------------------------------------------------------------------

    def add_request(self, request_id: str, prompt: str | list[int] | torch.Tensor,
                    params: SamplingParams | None = None, cache_salt: str | None = None,
                    lora_name: str | None = None, pooling: PoolingParams | None = None,
                    priority: int = 0, images: list[Any] | None = None) -> None:
        """Queue a request. Raises RequestError (and changes nothing) if it can never be served,
        UnknownAdapterError if `lora_name` names no loaded adapter.

        `priority` orders the queue under --scheduling-policy priority (lower first, vLLM's
        convention); under fcfs any value but 0 is refused.

        Under the pooling runner every request is an embedding, asked for with `pooling`
        (its output's `embedding`); `params` are then ignored.

        Requests with different cache_salt never share prefix-cache blocks (tenant isolation),
        nor do requests of different adapters (or of the base model and an adapter).

        `images` (PIL images, or prepare_images' ImageInputs) go where the prompt holds the
        model's image marker (LLaVA's `<image>`, Gemma 3's `<start_of_image>`): one per image,
        expanded here as the model's processor expands it, or already expanded.

        A tensor [tokens, hidden size], or prepare_prompt_embeds' PromptEmbeds, is a prompt
        given as embeddings (vLLM's prompt_embeds, under --enable-prompt-embeds): rows in
        place of the token embeddings the model would look up (core/prompt_embeds.py).
        """
        # An embedding's sequence samples nothing; one token of room keeps the scheduler's
        # bookkeeping that of any prompt.
        params = SamplingParams(max_tokens=1) if pooling is not None else \
            params or SamplingParams()
        if self._asleep:
            raise EngineAsleepError("the engine is asleep (sleep mode); wake it up first "
                                    "(wake_up, or POST /wake_up)")
        if request_id in self._requests:
            raise RequestError(f"request id {request_id!r} is already in use")
        self.check_priority(priority)
        lora = self.lora_ref(lora_name)
        text, token_ids, spans, embeds = self._checked(
            prompt, params if pooling is None else None, pooling, images)
        if lora is not None:
            cache_salt = f"{cache_salt or ''}\x00{lora.cache_salt}"
        timings = RequestTimings()
        seq = self._new_sequence(request_id, 0, token_ids, params, timings, cache_salt, lora,
                                 spans, embeds)
        seq.priority = priority
        if pooling is not None:
            seq.pooling = SequencePooling(self.pooler, pooling)
        self._requests[request_id] = _Request(request_id, text, token_ids, params, timings, [seq],
                                              cache_salt, lora=lora, images=spans,
                                              embeds=embeds)
        self.scheduler.add(seq)

    def check_request(self, prompt: str | list[int] | torch.Tensor,
                      params: SamplingParams | None,
                      lora_name: str | None = None,
                      pooling: PoolingParams | None = None,
                      images: list[Any] | None = None) -> tuple[str | None, list[int]]:
        """Tokenize and validate without queueing; raises RequestError for what can't run.
        An embedding (`pooling`) has no `params`: its prompt alone must fit. The token ids
        returned hold each image's placeholders expanded."""
        self.lora_ref(lora_name)
        return self._checked(prompt, params, pooling, images)[:2]

    def _checked(self, prompt: str | list[int] | torch.Tensor, params: SamplingParams | None,
                 pooling: PoolingParams | None, images: list[Any] | None,
                 ) -> tuple[str | None, list[int], list[ImageSpan], PromptEmbeds | None]:
        self._check_runner(pooling)
        if isinstance(prompt, torch.Tensor | PromptEmbeds):
            embeds = self._prompt_embeds(prompt, params, pooling, images)
            self._check_fits(embeds.token_ids, params.n, params.max_tokens)
            self._check_sampling(params)
            return None, embeds.token_ids, [], embeds
        if images and isinstance(prompt, str) and self.images is not None:
            prompt = self.images.expand_text(prompt)  # as the model's processor writes it
        text, token_ids = self._tokenize(prompt)
        if params is not None and params.truncate_prompt_tokens is not None and pooling is None:
            if images:
                raise RequestError("truncate_prompt_tokens cannot cut a prompt with images",
                                   param="truncate_prompt_tokens")
            token_ids = truncated(token_ids, params.truncate_prompt_tokens, self.tokenizer,
                                  self.max_model_len)
        token_ids, spans = self._place_images(token_ids, images)
        if pooling is not None:
            pooling.check(self.model_config.hidden_size)
            self._check_token_types(pooling.token_type_ids, len(token_ids))
            self._check_fits(token_ids)
            return text, token_ids, spans, None
        self._check_fits(token_ids, params.n, params.max_tokens)
        self._check_sampling(params)
        return text, token_ids, spans, None

    def prepare_prompt_embeds(self, value: Any, keep: int | None = None) -> PromptEmbeds:
        """A prompt given as embeddings, checked against the model and in its dtype, once
        (thread-safe: a server runs it off the engine's thread), its last `keep` rows where
        truncate_prompt_tokens asks; RequestError naming prompt_embeds."""
        if not self.config.enable_prompt_embeds:
            raise RequestError("a prompt given as embeddings needs the server started with "
                               "--enable-prompt-embeds", param="prompt_embeds")
        embeds = value if isinstance(value, PromptEmbeds) else \
            PromptEmbeds.of(value, self.model_config.hidden_size, self.dtype)
        return embeds if keep is None else \
            embeds.last(self.max_model_len if keep == -1 else keep)

    def _prompt_embeds(self, value: torch.Tensor | PromptEmbeds, params: SamplingParams | None,
                       pooling: PoolingParams | None,
                       images: list[Any] | None) -> PromptEmbeds:
        """A prompt given as embeddings, checked (RequestError naming prompt_embeds)."""
        embeds = self.prepare_prompt_embeds(
            value, None if params is None else params.truncate_prompt_tokens)
        if pooling is not None or images:
            raise RequestError("a prompt given as embeddings is generated from, alone: it "
                               "carries no images and is not embedded again",
                               param="prompt_embeds")
        if params.prompt_logprobs is not None:
            raise RequestError("prompt_logprobs: a prompt given as embeddings has no tokens "
                               "to score", param="prompt_logprobs")
        return embeds

    def prepare_images(self, images: list[Any],
                       settings: dict[str, Any] | None = None) -> list[ImageInput]:
        """Images as the model's processor prepares them, with a request's own processor
        settings (thread-safe: a server runs it off the engine's thread); RequestError for an
        image that cannot be read, a setting the processor lacks, or a model that reads no
        images."""
        if self.images is None:
            raise RequestError(f"this model ({self._model_kind()}) reads text only: a prompt "
                               "cannot carry images", param="images")
        return self.images.prepare(images, settings)

    def _place_images(self, token_ids: list[int], images: list[Any] | None,
                      ) -> tuple[list[int], list[ImageSpan]]:
        if not images:
            return token_ids, []
        self.check_image_count(len(images))
        return self.images.place(token_ids, self.prepare_images(images))

    def check_image_count(self, count: int) -> None:
        """RequestError for more images than one prompt may carry (--limit-mm-per-prompt);
        the server asks before it fetches any."""
        limit = self.config.image_limit()
        if limit is not None and count > limit:
            raise RequestError(f"the prompt carries {count} images; this model takes at most "
                               f"{limit} per prompt (--limit-mm-per-prompt)", param="images")

    def _model_kind(self) -> str:
        outer = getattr(self.model_config, "multimodal", None)
        return f"{outer}'s language model" if outer else architecture_of(self.model_config)

    def _check_token_types(self, types: tuple[int, ...] | None, length: int) -> None:
        """RequestError for token types the model does not read, or that do not match the
        prompt token for token."""
        if types is None:
            return
        classifier = self.pooler.classifier if self.pooler is not None else None
        if classifier is None or not classifier.token_types:
            raise RequestError("token types are read only by a BERT cross-encoder's pairs; "
                               "this model reads none", param="token_type_ids")
        count = int(self.model_config.type_vocab_size)
        if len(types) != length or any(not 0 <= t < count for t in types):
            raise RequestError(f"token_type_ids must give one type in [0, {count}) for each "
                               f"of the prompt's {length} tokens", param="token_type_ids")

    def check_priority(self, priority: int) -> None:
        """RequestError for a priority this server's scheduling policy does not take."""
        if priority and self.config.scheduling_policy != "priority":
            raise RequestError(f"priority {priority} needs --scheduling-policy priority; this "
                               "server schedules first come, first served (fcfs), where "
                               "every request's priority is 0", param="priority")

    @property
    def runner_kind(self) -> str:
        """generate, or pooling (embeddings, or a classifier's probabilities)."""
        return "generate" if self.pooler is None else "pooling"

    @property
    def task(self) -> str:
        """What the model serves, by vLLM's names: generate, embed or classify."""
        return "generate" if self.pooler is None else self.pooler.task

    @staticmethod
    def _check_without_text(params: SamplingParams) -> None:
        """RequestError for a setting that reads the reply's text or the tokenizer, under
        --skip-tokenizer-init."""
        needs = {"stop": params.stop, "bad_words": params.bad_words,
                 "structured_outputs": params.structured_outputs}
        for field, value in needs.items():
            if value:
                raise RequestError(f"{field} needs the tokenizer, which {NO_TOKENIZER}",
                                   param=field)

    def _check_runner(self, pooling: PoolingParams | None) -> None:
        asked = "generate" if pooling is None else pooling.task
        if asked == self.task:
            if asked == "classify" and pooling.dimensions is not None:
                raise RequestError("dimensions: a classifier's output is one value per label, "
                                   "not an embedding", param="dimensions")
            return
        raise RequestError(f"this model is served for {TASK_SERVED[self.task]}: it "
                           f"{TASK_LACKS[asked]}")

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Stop a request now; its blocks return to the pool at once."""
        req = self._requests.pop(request_id, None)
        if req is None:
            return None
        for seq in req.seqs:
            if seq.awaits_token:
                seq.output_token_ids.pop()
            if not seq.is_finished:
                seq.finish_reason = "abort"
                self.scheduler.finish(seq)
        req.timings.finished = time.monotonic()
        req.finished = True
        self.last_advanced = [req]
        return request_output(req)

    # ---- LoRA adapters --------------------------------------------------------------------

    def add_lora(self, name: str, path: str, directory: str | None = None) -> None:
        """Serve the PEFT adapter at `path` (a directory, hf:// or s3://) as `name`; `directory`
        is fetch_lora's for it, where that ran already. LoRAAdapterError, naming the adapter
        and what is wrong, if it can't be served."""
        self._lora_registry(name).add(name, path, directory)

    def fetch_lora(self, name: str, path: str) -> str:
        """add_lora's download and checks, which change no engine state: the server runs
        them off the engine loop's thread, so a download does not stall every request."""
        return self._lora_registry(name).fetch(name, path)

    def _lora_registry(self, name: str) -> LoRARegistry:
        if self.lora is None:
            raise LoRAAdapterError(f"LoRA adapter {name!r}: LoRA is not enabled "
                                   "(start the engine with --enable-lora)")
        return self.lora

    def remove_lora(self, name: str) -> None:
        """Refuse new requests for `name` now; those already admitted finish on it."""
        if self.lora is None:
            raise LoRAAdapterError(f"LoRA adapter {name!r} is not loaded (LoRA is not enabled)")
        self.lora.remove(name)

    def lora_adapters(self) -> dict[str, str]:
        """{name: path as given} of the served adapters; safe to read from another thread."""
        return self.lora.paths() if self.lora is not None else {}

    def lora_batch_info(self) -> tuple[list[str], list[str]]:
        """Adapter names of the running and of the waiting sequences, each sorted, once each.
        Read it on the engine's thread (a step observer): the queues change during a step."""
        def names(seqs) -> list[str]:
            return sorted({s.lora.name for s in list(seqs) if s.lora is not None})
        return names(self.scheduler.running), names(self.scheduler.waiting)

    def lora_ref(self, name: str | None) -> LoRARef | None:
        """The loaded adapter `name` (None for None); UnknownAdapterError if none is."""
        if name is None:
            return None
        ref = self.lora.get(name) if self.lora is not None else None
        if ref is None:
            served = ", ".join(sorted(self.lora_adapters())) or "none"
            raise UnknownAdapterError(f"the LoRA adapter {name!r} does not exist (adapters "
                                      f"served: {served})", param="model")
        return ref

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def quantization(self) -> str:
        """The weight quantization that runs: --quantization, or what an unset one resolved
        to for this checkpoint and device ("none" where nothing is quantized)."""
        return getattr(self.runner.model, "quantization", None) or "none"

    def kv_cache_stats(self, slots: bool = True) -> KVCacheStats:
        """The KV pool's counts; slots=False skips counting used slots (KVCacheManager.stats)."""
        return self.kv.stats(slots)

    def memory_report(self) -> dict[str, Any]:
        """What the weights, the KV pool and a linear-attention model's recurrent states take
        (one rank's shard of each under tensor parallelism): the figures quantization
        changes."""
        stats = self.kv.stats()
        return {"tensor_parallel_size": self.config.tensor_parallel_size,
                "quantization": self.quantization,
                "weights_bytes": weight_bytes(self.runner.model),
                "step_weights_bytes": step_weight_bytes(self.runner.model),
                "kv_cache_dtype": stats.dtype,
                "kv_bytes_per_token": stats.bytes_per_token,
                "kv_tokens_per_gib": stats.tokens_per_gib,
                "kv_capacity_tokens": stats.num_blocks * self.config.block_size,
                "kv_pool_bytes": stats.num_blocks * self.runner.layout.bytes_per_block,
                "recurrent_state_bytes": self.runner.states.nbytes if self.runner.states
                else 0}

    def load_report(self) -> dict[str, float]:
        """What fetching and loading the model took (rank 0's shard under tensor
        parallelism): set once, read by the start-up log and /metrics."""
        report = self.runner.model.load_report
        return {"download_seconds": self._download_seconds, "load_seconds": report.seconds,
                "load_bytes": report.bytes, "load_gb_per_s": report.gb_per_s}

    def startup_report(self) -> dict[str, float]:
        """Seconds of each start-up phase (rank 0's under tensor parallelism) and of the whole
        start-up; the rest of the total is fetching the model, starting the tensor-parallel
        workers and building the scheduler. The first engine of a process also pays for
        importing transformers' config classes in config_seconds."""
        phases = {**self._phase_seconds, **self.runner.startup_seconds}
        return {**{f"{name}_seconds": seconds for name, seconds in phases.items()},
                "total_seconds": self._startup_seconds}

    def _load_log_fields(self) -> dict[str, Any]:
        report = self.runner.model.load_report
        return {"download_seconds": round(self._download_seconds, 3), **report.log_fields()}

    @property
    def offload_block_bytes(self) -> int:
        """Bytes one block copy between the tiers moves, over every tensor-parallel rank."""
        return self.runner.layout.bytes_per_block * self.config.tensor_parallel_size

    # ---- sleep mode ------------------------------------------------------------------------

    @property
    def is_sleeping(self) -> bool:
        return bool(self._asleep)

    def sleep(self, level: int = 1) -> None:
        """vLLM's sleep mode (--enable-sleep-mode), for a device another process needs for a
        while: level 1 moves the weights to host memory (on a GPU) and frees the KV cache,
        whose cached prefixes are forgotten, until wake_up. Level 2 frees the weights outright
        (on the CPU too), for a trainer that brings new ones: waking reads them from the
        checkpoint again (the model's, or the latest reload_weights'). Requests are refused
        (EngineAsleepError) meanwhile. SleepModeError while a request is unfinished; asleep
        already, nothing changes; ValueError for another level, or level 2 of a model whose
        weights are not read back in place (reload_weights')."""
        if not self.config.enable_sleep_mode:
            raise ConfigError("enable_sleep_mode", "sleep mode is off; start the engine with "
                                                   "--enable-sleep-mode")
        if level not in (1, 2):
            raise ValueError(f"level {level} is not supported: level 1 moves the weights to "
                             "host memory and frees the KV cache; level 2 frees both")
        if level == 2 and (refusal := self._reload_refusal()) is not None:
            raise ValueError(f"level 2 reads the weights again when woken, but {refusal}; "
                             "level 1 keeps them in host memory")
        self._check_idle("sleep mode")
        self.reset_prefix_cache()
        if "kv_cache" not in self._asleep:
            self._on_every_rank("release_kv")
        if "weights" not in self._asleep:
            if level == 2:
                self._on_target_ranks("drop_weights")
            else:
                self._on_every_rank("offload_weights")
        self._asleep = set(SLEEP_TAGS)
        host, dropped = self.runner.host_weights, self.runner.dropped_weights
        log.info("engine asleep", extra={"level": level,
                                         "host_weights_bytes": host.nbytes if host else 0,
                                         "dropped_weights_bytes":
                                             dropped.nbytes if dropped else 0})

    def reload_weights(self, path: str | None = None) -> None:
        """Read a checkpoint of the running model's shapes into its weights, in place, on
        every tensor-parallel rank: `path` (anything --model takes: a trainer's new weights,
        a fine-tune of the same base) or, None, the model's own again. Cached prefixes are
        forgotten (their KV came from the old weights); decode graphs stay valid. Waits for
        an idle engine (SleepModeError otherwise); asleep, the weights must be woken first.
        ModelLoadError for a checkpoint of other shapes; ValueError for a model whose
        weights are quantized after loading (they are not read back in place)."""
        self._check_weights_change("reloading the weights")
        source = self.runner.weights_source if path is None else \
            resolve_model(path, self.config.download_dir,
                          ignore_patterns=self.config.ignore_patterns)
        check_reload(self.model_config, source)
        started = time.perf_counter()
        self._on_target_ranks("reload_weights", source)
        self.reset_prefix_cache()
        log.info("weights reloaded", extra={"path": path or self.config.model,
                                            "seconds": round(time.perf_counter() - started, 3)})

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy tensors under their Hugging Face names (a trainer's state dict, whole or some
        of it) into the running model's weights, in place, on every tensor-parallel rank
        (sharded there as the checkpoint's tensors are); the cached prefixes are forgotten.
        As reload_weights, waits for an idle, awake engine of unquantized weights without
        LoRA; ModelLoadError for a name the model has no place for or a shape that does not
        fit, the tensors before it already copied."""
        self._check_weights_change("loading weights")
        weights = list(weights)
        if self.workers is not None:  # sent to the other ranks' processes from the host
            self.workers.call("load_weights", [(n, t.detach().cpu()) for n, t in weights])
        self.runner.load_weights(weights)
        self.reset_prefix_cache()
        log.info("weights loaded", extra={"tensors": len(weights)})

    def _check_weights_change(self, action: str) -> None:
        """ValueError for weights not read back in place; SleepModeError while a request is
        unfinished or the weights are asleep."""
        if (refusal := self._reload_refusal()) is not None:
            raise ValueError(f"the weights cannot be changed in place: {refusal}")
        self._check_idle(action)
        if "weights" in self._asleep:
            raise SleepModeError("the weights are asleep; wake them up first (tags=weights)")

    def _check_idle(self, action: str) -> None:
        """SleepModeError naming `action` while a request is unfinished."""
        if self.has_unfinished_requests():
            raise SleepModeError(f"{len(self._requests)} request(s) are unfinished; {action} "
                                 "waits for an idle engine")

    def _reload_refusal(self) -> str | None:
        if self.config.enable_lora:
            return "LoRA's slots wrap the layers a checkpoint's tensors are read into"
        return reload_refusal(self.runner.model)

    def wake_up(self, tags: Iterable[str] | None = None) -> None:
        """Bring back what sleep took: `tags` "weights", "kv_cache" or both (the default), as
        vLLM's; requests are served again once both are back (the decode graphs are captured
        again then). ValueError for another tag."""
        tags = SLEEP_TAGS if tags is None else tuple(tags)
        unknown = [t for t in tags if t not in SLEEP_TAGS]
        if unknown:
            raise ValueError(f"tags: {unknown[0]!r} is not one of {', '.join(SLEEP_TAGS)}")
        for tag, method in (("weights", "restore_weights"), ("kv_cache", "restore_kv")):
            if tag in tags and tag in self._asleep:
                self._on_every_rank(method)
                self._asleep.discard(tag)
        if not self._asleep:
            log.info("engine awake")

    def _on_every_rank(self, method: str) -> None:
        """One of the runner's sleep-mode methods, on every tensor-parallel rank and on the
        draft model's runner."""
        self._on_target_ranks(method)
        draft = getattr(self.scheduler.proposer, "runner", None)
        if draft is not None:
            getattr(draft, method)()

    def _on_target_ranks(self, method: str, *args: Any) -> None:
        """One of the runner's methods on every tensor-parallel rank of the served model."""
        if self.workers is not None:
            self.workers.call(method, *args)
        getattr(self.runner, method)(*args)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix (vLLM's reset_prefix_cache: after the weights change,
        or to measure without it); False, changing nothing, while a request is unfinished."""
        if self.has_unfinished_requests():
            return False
        self.kv.reset_prefix_cache()
        return True

    @property
    def kv_cache_usage(self) -> float:
        """Fraction of KV blocks in use; cheap and safe to read from another thread."""
        return self.kv.allocator.num_used / self.kv.allocator.num_blocks

    # ---- the step -------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one batch; return an output for every request that advanced or finished.

        Under async scheduling a step's tokens are read back during the next step: that step
        is scheduled and handed to the device first (its input ids read the tokens there), and
        the host appends, detokenizes and checks stops while the device computes it. A
        sequence a token stops is then in one step too many, whose row is dropped."""
        plan = self.scheduler.schedule()
        self.last_plan = plan
        pending, self._pending = self._pending, None
        if not plan.scheduled:
            return self._outputs(self._read_back(pending))
        try:
            if self.images is not None:
                self.images.encode_for_step(plan.scheduled)
            inputs = build_step_inputs(plan.scheduled, self.config.block_size,
                                       block_copies=plan.block_copies,
                                       transfers=(plan.kv_to_host, plan.kv_to_device),
                                       lora_loads=plan.lora_loads,
                                       state_copies=plan.state_copies)
            logits = self.runner.execute(inputs)
        except RuntimeError:
            if self.workers is not None:  # a collective failed: name the worker that died
                self.workers.raise_if_failed(wait_s=5.0)
            raise
        touched = self._read_back(pending)
        record_prompt_logprobs(plan.scheduled, self.runner.prompt_scores)
        record_pooled(plan.scheduled, self.runner.pooled)
        draws, embedded = self._advance(plan.scheduled, inputs.num_logits)
        for seq in embedded:
            self._finish_embedding(seq)
            touched[seq.request_id] = self._requests[seq.request_id]
        if not self.async_scheduling:
            for draw in verify(draws, logits, self._sample_rows, self.speculation_stats):
                self._settle(draw.seq, draw.proposals, touched)
            return self._outputs(touched)
        outputs = self._outputs(touched)  # before this step's placeholders join the tokens
        self._pending = self._sample_later(logits, draws)
        return outputs

    def _advance(self, scheduled: list[tuple[Sequence, int]],
                 logit_rows: list[int]) -> tuple[list[Draw], list[Sequence]]:
        """Count the step's tokens as computed; return the sequences to sample (with their
        first logit row and proposals) and the embeddings whose whole prompt is now computed.
        logit_rows: each sequence's rows of the step's logits (StepInputs.num_logits)."""
        draws: list[Draw] = []
        embedded: list[Sequence] = []
        row = 0
        for (seq, num_new), rows in zip(scheduled, logit_rows, strict=True):
            first, row = row, row + rows
            if seq.spec_tokens:  # its last token now computed; proposals once accepted
                seq.num_computed_tokens += 1
                draws.append(Draw(seq, first, seq.spec_tokens))
                continue
            if seq.is_finished:  # stopped by the token read back since this step was scheduled
                continue
            seq.num_computed_tokens += num_new
            self.kv.cache_computed_blocks(seq)
            if seq.images:
                PromptImages.release_computed(seq.images, seq.num_computed_tokens)
            if seq.pooling is not None:
                if seq.num_computed_tokens == seq.num_tokens:
                    embedded.append(seq)
            elif rows:  # else a prompt chunk, with more to come: no logits
                if seq.params.n == 1:  # the common case: no fork, no list built
                    draws.append(Draw(seq, first))
                else:
                    draws += [Draw(member, first) for member in self._fork_if_first_sample(seq)]
        return draws, embedded

    def _settle(self, seq: Sequence, proposals: list[int],
                touched: dict[str, _Request]) -> None:
        """After a sequence's tokens are appended: release a finished one, index what it
        accepted of its proposals and release the rest; note its request as advanced."""
        if seq.finish_reason is not None:
            self.kv.cache_computed_blocks(seq)
            self.scheduler.finish(seq)
        elif proposals:
            self.kv.cache_computed_blocks(seq)
            self.kv.trim(seq)
        touched[seq.request_id] = self._requests[seq.request_id]

    def _outputs(self, touched: dict[str, _Request]) -> list[RequestOutput]:
        outputs = []
        self.last_advanced = list(touched.values())
        for req in self.last_advanced:
            if len(req.seqs) == req.params.n and all(s.is_finished for s in req.seqs):
                req.finished = True
                req.timings.finished = time.monotonic()
                del self._requests[req.request_id]
            kind = req.params.output_kind
            if req.finished or kind is RequestOutputKind.CUMULATIVE or (
                    kind is RequestOutputKind.DELTA
                    and delta_due(req, self.config.stream_interval)):
                outputs.append(request_output(req))
        return outputs

    def _sample_later(self, logits: torch.Tensor, draws: list[Draw]) -> _PendingStep | None:
        """Sample the draws' rows without waiting for the tokens: each sequence holds a
        placeholder for its token until the next step reads it back (_read_back)."""
        if not draws:
            return None
        seqs = [d.seq for d in draws]
        pending = sample_later(self._rows(logits, [d.row for d in draws]), seqs,
                               self._generator, self.eos_token_ids, self.config.logprobs_mode)
        self.runner.sampled = pending.tokens
        for row, seq in enumerate(seqs):
            seq.output_token_ids.append(placeholder(row))
        return _PendingStep(seqs, pending)

    def _read_back(self, pending: _PendingStep | None) -> dict[str, _Request]:
        """Replace the placeholders of an earlier sample_later by its tokens, as a synchronous
        step appends them; return the requests that advanced."""
        touched: dict[str, _Request] = {}
        if pending is None:
            return touched
        result = pending.sample.result()
        now = time.monotonic()
        for seq, token, logprobs in zip(pending.seqs, result.token_ids, result.logprobs,
                                        strict=True):
            if seq.is_finished:  # aborted meanwhile: abort_request dropped its placeholder
                continue
            seq.output_token_ids.pop()
            self._append(seq, token, logprobs, now)
            self._settle(seq, [], touched)
        return touched

    def _rows(self, logits: torch.Tensor, rows: list[int]) -> torch.Tensor:
        if rows == list(range(len(logits))):
            return logits
        return logits[list_to_device(rows, torch.long, logits.device)]

    def _append(self, seq: Sequence, token: int, logprobs: dict[int, float] | None,
                now: float) -> None:
        if seq.timings.first_token is None:  # the request's timings, shared by its sequences
            seq.timings.first_token = now
        append_token(seq, token, logprobs, self.eos_token_ids, self.max_model_len)

    # ---- helpers --------------------------------------------------------------------------

    def _finish_embedding(self, seq: Sequence) -> None:
        seq.embedding = embedding(seq.pooling, seq.num_tokens)
        seq.pooling.sums = None
        seq.finish_reason = "stop"
        timings = self._requests[seq.request_id].timings
        timings.first_token = timings.first_token or time.monotonic()
        self.scheduler.finish(seq)

    def _sample_rows(self, logits: torch.Tensor, rows: list[int],
                     seqs: list[Sequence]) -> list[int]:
        """Sample these logit rows, one per sequence, and append each token to its sequence."""
        result = sample(self._rows(logits, rows), seqs, self._generator, self.eos_token_ids,
                        self.config.logprobs_mode)
        now = time.monotonic()
        for seq, token, logprobs in zip(seqs, result.token_ids, result.logprobs, strict=True):
            self._append(seq, token, logprobs, now)
        return result.token_ids

    def _fork_if_first_sample(self, seq: Sequence) -> list[Sequence]:
        """At a request's first sample, n > 1 becomes n sequences sharing the prompt blocks
        (an n = 1 sequence is drawn alone by its caller, _advance)."""
        if seq.index != 0:
            return [seq]
        req = self._requests[seq.request_id]
        if len(req.seqs) == req.params.n:
            return [seq]
        members = [seq]
        for index in range(1, req.params.n):
            child = self._new_sequence(req.request_id, index, req.prompt_token_ids, req.params,
                                       req.timings, req.cache_salt, req.lora, req.images,
                                       req.embeds)
            child.num_computed_tokens = seq.num_computed_tokens
            child.priority = seq.priority
            child.prompt_logprobs = seq.prompt_logprobs  # scored once, by the first
            self.kv.fork(seq, child)
            self.scheduler.add_running(child)
            req.seqs.append(child)
            members.append(child)
        return members

    def _new_sequence(self, request_id: str, index: int, token_ids: list[int],
                      params: SamplingParams, timings: RequestTimings,
                      cache_salt: str | None, lora: LoRARef | None = None,
                      images: list[ImageSpan] | None = None,
                      embeds: PromptEmbeds | None = None) -> Sequence:
        generator = None
        if not params.greedy and params.seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(params.seed + index * 7919)
        # The text of a prompt given as embeddings is nobody's: the output's starts afresh.
        detok = IncrementalDetokenizer(self.tokenizer, [] if embeds is not None else token_ids,
                                       params.skip_special_tokens)
        constraint = (self.structured.matcher(params.structured_outputs)
                      if params.structured_outputs is not None else None)
        seq = Sequence(next(self._seq_ids), request_id, index, token_ids, params, generator,
                       detok, timings, cache_salt, constraint, lora)
        seq.bad_word_ids = self._bad_word_ids(params.bad_words or [])
        seq.images = images or []
        seq.prompt_embeds = embeds
        return seq

    def _bad_word_ids(self, words: list[str]) -> list[list[int]]:
        """Each bad word's tokens, spelled at the start of a text and after a space (most
        tokenizers fold the space into the word's first token)."""
        spellings = {spelling for word in words
                     for spelling in (word.lstrip(), " " + word.lstrip())}
        ids = {tuple(self.tokenizer.encode(s, add_special_tokens=False)) for s in spellings}
        vocab = self.model_config.vocab_size  # a word spelled past it can never be generated
        return [list(t) for t in sorted(ids) if t and max(t) < vocab]

    def _tokenize(self, prompt: str | list[int]) -> tuple[str | None, list[int]]:
        vocab = self.model_config.vocab_size
        if isinstance(prompt, str) and self.tokenizer is None:
            raise RequestError(f"a text prompt needs the tokenizer, which {NO_TOKENIZER}: "
                               "send token ids")
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
            if ids and max(ids) >= vocab:  # a tokenizer larger than the model's embeddings
                raise RequestError(f"the prompt holds tokens the model has no embedding for "
                                   f"(ids past its vocabulary of {vocab}: "
                                   f"{sorted({t for t in ids if t >= vocab})[:5]})")
            return prompt, ids
        ids = list(prompt)
        if not ids:
            raise RequestError("the prompt is empty")
        bad = [t for t in ids if not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise RequestError(f"prompt token ids must be integers in [0, {vocab}), got {bad[:5]}")
        return None, ids

    def _check_sampling(self, params: SamplingParams) -> None:
        """Logprobs within --max-logprobs; token ids in logit_bias exist; a constraint
        compiles."""
        vocab = self.model_config.vocab_size
        if self.tokenizer is None:
            self._check_without_text(params)
        self.check_logprobs(params.logprobs, "logprobs")
        self.check_logprobs(params.prompt_logprobs, "prompt_logprobs")
        for field in ("allowed_token_ids", "stop_token_ids"):
            bad = sorted(t for t in getattr(params, field) or () if t >= vocab)
            if bad:  # a stop id is masked while short of min_tokens: it must index the logits
                raise RequestError(f"{field}: token ids must be in [0, {vocab}), got {bad[:5]}",
                                   param=field)
        if params.logit_bias:
            bad = sorted(t for t in params.logit_bias if t >= vocab)
            if bad:
                raise RequestError(f"logit_bias: token ids must be in [0, {vocab}), got "
                                   f"{bad[:5]}", param="logit_bias")
        banned = self._first_step_bans(params) if params.allowed_token_ids else set()
        self._check_something_allowed(params, banned)
        self.check_constraint(params)
        self._check_grammar_meets_allowed(params, banned)

    def _check_something_allowed(self, params: SamplingParams, banned: set[int]) -> None:
        """RequestError where every token allowed_token_ids lets through is banned at the first
        step (`banned`: a one-token bad word, or a stop id or EOS while short of min_tokens)."""
        if params.allowed_token_ids is None:
            return
        if set(params.allowed_token_ids) <= banned:
            raise RequestError("allowed_token_ids: every token it allows is banned (by "
                               "bad_words, or as a stop token or EOS while the reply is "
                               "short of min_tokens)", param="allowed_token_ids")

    def _first_step_bans(self, params: SamplingParams) -> set[int]:
        """The tokens the first step may not draw: one-token bad words, and while short of
        min_tokens the stop ids and EOS."""
        banned = {word[0] for word in self._bad_word_ids(params.bad_words or [])
                  if len(word) == 1}
        if params.min_tokens:
            banned |= set(params.stop_token_ids)
            if not params.ignore_eos:
                banned |= self.eos_token_ids
        return banned

    def _check_grammar_meets_allowed(self, params: SamplingParams, banned: set[int]) -> None:
        """RequestError where the constraint's first token can be none of allowed_token_ids
        that the first step does not ban: the hard limits leave nothing to draw."""
        if params.structured_outputs is None or not params.allowed_token_ids:
            return
        first = self.structured.first_mask(params.structured_outputs)
        if not bitmask.allows_any(first, set(params.allowed_token_ids) - banned):
            raise RequestError("allowed_token_ids: none of its tokens can begin the output's "
                               "required format (its JSON schema, regex, choice or grammar)",
                               param="allowed_token_ids")

    def check_logprobs(self, asked: int | None, field: str) -> None:
        """RequestError naming `field` where more log-probabilities per token are asked for
        than --max-logprobs allows (-1: the vocabulary)."""
        limit = self.config.max_logprobs
        if limit == -1:
            limit = self.model_config.vocab_size
        if asked is not None and asked > limit:
            raise RequestError(f"{field}: {asked} log-probabilities per token asked for, more "
                               f"than the {limit} --max-logprobs allows", param=field)

    def check_constraint(self, params: SamplingParams) -> None:
        """Compile the request's constraint, if any; RequestError if it does not compile.
        Thread-safe, and compiled grammars are cached: a caller may compile ahead on another
        thread, and the checks and sequences that follow find it compiled."""
        if params.structured_outputs is None:
            return
        if self.tokenizer is None:
            self._check_without_text(params)
        try:
            self.structured.compile(params.structured_outputs)
        except GrammarError as exc:
            raise RequestError(str(exc), param="structured_outputs") from None

    def _check_fits(self, token_ids: list[int], n: int = 1, new_tokens: int = 0) -> None:
        """n sequences of the prompt and new_tokens (max_tokens) more fit the batch and the
        context, which the pool holds (_fit_pool)."""
        if not token_ids:
            raise RequestError("the prompt is empty")
        if n > self.config.max_num_seqs:
            raise RequestError(f"n={n} exceeds max_num_seqs={self.config.max_num_seqs}",
                               param="n")
        total = len(token_ids) + new_tokens
        if total > self.max_model_len:
            asked = (f"{total} ({len(token_ids)} in the prompt plus {new_tokens} max_tokens); "
                     "shorten the prompt or lower max_tokens") if new_tokens else \
                f"{total} in the prompt; shorten it"
            raise RequestError(f"this model's maximum context length is {self.max_model_len} "
                               f"tokens, but the request asks for {asked}")


def _pooler(config: EngineConfig, model_config: Any, directory: str) -> Pooler | None:
    """The pooling runner's pooler (the model's, under --pooler-config), None for generate;
    ConfigError for a checkpoint or option the chosen runner cannot serve."""
    runner = config.runner
    classifier = classifier_of(model_config)
    if runner == "auto":
        pools = classifier is not None or embedding_checkpoint(model_config, directory)
        runner = "pooling" if pools else "generate"
    if runner == "generate":
        encoder = encoder_of(model_config) is not None
        if is_bare_decoder(model_config) or encoder or classifier is not None:
            kind, what = (("a sequence classifier", "a classification model") if classifier
                          else ("an encoder" if encoder else "a bare decoder",
                                "an embedding model"))
            raise ConfigError("runner", f"the checkpoint is {kind} "
                              f"({', '.join(model_config.architectures)}) without an LM head: "
                              f"{what}; serve it with --runner pooling")
        return None
    config.check_pooling_options()
    overrides = config.pooler_overrides()
    encoder = encoder_of(model_config) is not None
    if classifier is not None and encoder:  # the first token's state, through the head
        if overrides.get("pooling_type", "CLS") != "CLS":
            raise ConfigError("pooler_config", f"an encoder's classification head reads the "
                              f"first token's hidden state (CLS), not "
                              f"{overrides['pooling_type']}")
        return Pooler("CLS", normalize=False, classifier=classifier).updated(overrides)
    if classifier is not None:  # the last token's state, through the head
        return Pooler("LAST", normalize=False, classifier=classifier).updated(overrides)
    # Without sentence-transformers files an encoder embeds its first token, as vLLM does.
    default = Pooler("CLS") if encoder else Pooler()
    return model_pooler(directory, default).updated(overrides)


def _check_encoder_options(config: EngineConfig) -> None:
    """ConfigError for an option an encoder does not run with. Chunked prefill and the prefix
    cache are off for it whatever they say: no prompt can be split (each token sees every
    other), and there is no KV cache to share."""
    if config.tensor_parallel_size > 1:
        raise ConfigError("tensor_parallel_size", "encoders (BERT's family) run on one device; "
                                                  "use tensor_parallel_size 1")
    if config.quantization not in (None, "none"):
        raise ConfigError("quantization", f"{config.quantization} is not served for encoders "
                                          "(BERT's family); they run unquantized")


def _head_token_ids(pooler: Pooler | None, tokenizer: Any) -> tuple[int, ...]:
    """The vocabulary ids of a classifier's classifier_from_token; ConfigError for a token
    the tokenizer does not hold whole."""
    tokens = pooler.classifier.from_tokens if pooler and pooler.classifier else ()
    if tokens and tokenizer is None:
        raise ConfigError("skip_tokenizer_init", "classifier_from_token names tokens of the "
                                                 "tokenizer, which is not loaded")
    ids = []
    for token in tokens:
        found = tokenizer.convert_tokens_to_ids(token)
        if not isinstance(found, int) or (found == tokenizer.unk_token_id
                                          and token != tokenizer.unk_token):
            raise ConfigError("hf_overrides", f"classifier_from_token {token!r} is not one "
                                              "token of the tokenizer's vocabulary")
        ids.append(found)
    return tuple(ids)


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("device", f"{name} was asked for but no CUDA device is available")
    return torch.device(name)


def _dtype(name: str, device: torch.device, quantized_file: bool) -> torch.dtype:
    """--dtype; auto: bfloat16 on CUDA, on a CPU by its cores and the weights' file
    (`quantized_file`: a GGUF file of quantized weights)."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else \
            default_cpu_dtype(quantized_file=quantized_file)
    return DTYPES[name]


def _max_model_len(config: EngineConfig, model_config: Any) -> int:
    """The context length: the model's (or --max-model-len, within it). Sliding-window layers
    attend over their window at any length, so the window does not bound it, unless
    --disable-sliding-window asks for it as the limit (vLLM's)."""
    limit, what = context_length_of(model_config), "the model's context length"
    window = sliding_window_of(model_config) if config.disable_sliding_window else None
    if window is not None and window < limit:
        limit, what = window, "the model's sliding window, which --disable-sliding-window " \
                              "makes the context length"
    if config.max_model_len is not None and config.max_model_len > limit:
        raise ConfigError("max_model_len", f"{config.max_model_len} exceeds {what} ({limit})")
    length = limit if config.max_model_len is None else config.max_model_len
    if not config.enable_chunked_prefill and config.max_num_batched_tokens < length:
        raise ConfigError("max_num_batched_tokens", f"({config.max_num_batched_tokens}) must "
                          f"be at least the context length ({length}) without chunked "
                          "prefill, where a prompt is prefilled in one step; raise it, lower "
                          "--max-model-len, or turn chunked prefill back on")
    return length


def _fit_pool(config: EngineConfig, length: int, num_blocks: int, device_type: str) -> int:
    """The context length one sequence can fill in a pool of num_blocks: `length` where the
    pool holds it. Otherwise the default (the model's length) is lowered to the pool's tokens,
    with a warning, so that a request leaving out max_tokens still fits; a --max-model-len
    the pool can't hold is a ConfigError naming what fits, as in vLLM."""
    capacity = num_blocks * config.block_size
    if length <= capacity:
        return length
    if config.num_gpu_blocks_override is not None:
        more = "raise --num-gpu-blocks-override"
    elif device_type == "cuda" and config.kv_cache_memory is None:
        more = "raise --gpu-memory-utilization"
    else:
        more = "raise --kv-cache-memory"
    if config.max_model_len is not None:
        raise ConfigError("max_model_len", f"{length} tokens do not fit the KV-cache pool, "
                          f"which holds {capacity} ({num_blocks} blocks of "
                          f"{config.block_size}); lower --max-model-len to at most {capacity} "
                          f"(or leave it out to get that), or {more}")
    log.warning("context length lowered to fit the KV-cache pool", extra={
        "model_context_length": length, "max_model_len": capacity, "kv_blocks": num_blocks,
        "to_keep_the_model_length": more})
    return capacity


def _check_linear_attention_options(config: EngineConfig, architecture: str) -> None:
    """ConfigError for what a model with linear-attention layers cannot serve: speculative
    decoding (a layer's state cannot take back a rejected token)."""
    if config.speculative() is not None:
        raise ConfigError("speculative_config", "speculative decoding is not served on "
                          f"{architecture}'s linear-attention layers (their state cannot "
                          "take back a rejected token)")


def _check_devices(option: str, device: torch.device, tp_size: int) -> None:
    if device.type != "cuda" or tp_size == 1:
        return
    if option.startswith("cuda:"):
        raise ConfigError("device", f"{option} names one GPU, but tensor_parallel_size "
                                    f"{tp_size} runs on cuda:0..{tp_size - 1}; use "
                                    "--device cuda (and CUDA_VISIBLE_DEVICES to pick GPUs)")
    count = torch.cuda.device_count()
    if count < tp_size:
        raise ConfigError("tensor_parallel_size", f"{tp_size} needs {tp_size} GPUs, but "
                                                  f"{count} are visible")


def _eos_ids(model_config: Any, tokenizer: Any, generation_config: Any,
             vocab_size: int) -> set[int]:
    """The ids that end a reply, from the config, the tokenizer and the generation config; an
    id past the model's vocabulary (a checkpoint's mismatch) is never sampled, and masking it
    under min_tokens would index past the logits, so it is left out."""
    values = [getattr(model_config, "eos_token_id", None),
              None if tokenizer is None else tokenizer.eos_token_id,
              getattr(generation_config, "eos_token_id", None)]
    ids: set[int] = set()
    for value in values:  # each is None, one id, or a list of ids
        ids.update(value if isinstance(value, list) else [] if value is None else [value])
    outside = sorted(i for i in ids if not 0 <= i < vocab_size)
    if outside:
        log.warning("EOS token ids past the model's vocabulary are left out",
                    extra={"ids": outside, "vocab_size": vocab_size})
    return ids - set(outside)
