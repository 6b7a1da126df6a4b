"""Beam search run on the engine in rounds (core/beam_search.py has the rules): `LLM.beam_search`
offline, and BeamSearchStream, which the server reads as it reads a request's stream."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from tokenmill.engine.core import (
    BeamSearch,
    BeamSearchOutput,
    BeamSearchParams,
    BeamSearchSequence,
    CompletionOutput,
    LLMEngine,
    RequestOutput,
    SamplingParams,
    completion_outputs,
    round_params,
)
from tokenmill.engine.core.errors import RequestError

if TYPE_CHECKING:
    from tokenmill.engine.frontend.async_engine import AsyncEngine, RequestStream
    from tokenmill.engine.frontend.llm import LLM


def new_search(engine: LLMEngine, params: BeamSearchParams, field: str) -> BeamSearch:
    """A search for one prompt; RequestError naming `field` (the beam width's) where it would
    rank more log-probabilities per token than --max-logprobs lets a request read."""
    if engine.config.logprobs_mode.endswith("_logits"):
        raise RequestError(f"{field}: beam search ranks log-probabilities, and this engine's "
                           f"logprobs report logits (--logprobs-mode "
                           f"{engine.config.logprobs_mode})", param=field)
    search = BeamSearch(params, engine.eos_token_ids)
    limit = engine.config.max_logprobs
    if limit != -1 and search.num_candidates > limit:
        raise RequestError(f"{field}: a beam search of width {params.beam_width} ranks the top "
                           f"{search.num_candidates} log-probabilities of each token, more than "
                           f"the {limit} --max-logprobs allows; raise --max-logprobs or narrow "
                           f"the beam", param=field)
    return search


def checked_prompt(engine: LLMEngine, prompt: str | list[int], params: BeamSearchParams,
                   lora_name: str | None = None) -> list[int]:
    """The prompt's token ids; RequestError where it, with max_tokens, does not fit."""
    return engine.check_request(prompt, SamplingParams(
        max_tokens=params.max_tokens, stop_token_ids=list(params.stop_token_ids)), lora_name)[1]


def run_offline(llm: LLM, prompts: list[str | list[int]], params: BeamSearchParams,
                use_tqdm: bool = False, lora: str | None = None) -> list[BeamSearchOutput]:
    """Every prompt's search, rounds of all of them batched together."""
    engine = llm.engine
    searches = [new_search(engine, params, "beam_width") for _ in prompts]
    prompt_ids = [checked_prompt(engine, p, params, lora) for p in prompts]
    per_round = [round_params(s) for s in searches]
    with tqdm(total=len(searches), desc="Beam search", disable=not use_tqdm) as bar:
        while live := [i for i, s in enumerate(searches) if not s.done]:
            beams = [(i, beam) for i in live for beam in searches[i].running]
            outs = iter(llm.generate([prompt_ids[i] + beam.tokens for i, beam in beams],
                                     [per_round[i] for i, _ in beams], lora=lora))
            for i in live:
                searches[i].advance([next(outs).outputs[0].logprobs[0]
                                     for _ in searches[i].running])
                bar.update(searches[i].done)
    return [BeamSearchOutput([
        BeamSearchSequence(ids + b.tokens, b.logprobs, b.cum_logprob,
                           llm.tokenizer.decode(ids + b.tokens), b.finish_reason, b.stop_reason)
        for b in search.best()]) for search, ids in zip(searches, prompt_ids, strict=True)]


class BeamSearchStream:
    """A beam search read as a request's RequestStream is: one output, finished, whose n
    completions are the hypotheses, best first. `start()` admits the first round, so a
    refused prompt is the caller's error; closing the stream before the end aborts the round
    in flight."""

    def __init__(self, engine: AsyncEngine, request_id: str, prompt_ids: list[int],
                 search: BeamSearch, options: dict[str, Any],
                 decode: Callable[[list[int]], str], logprobs: int | None) -> None:
        self.request_id = request_id
        self.finished = False
        self._engine = engine
        self._prompt_ids = prompt_ids
        self._search = search
        self._options = options  # add_request's keywords but params (the adapter, the salt)
        self._params = round_params(search, logprobs)
        self._decode = decode
        self._with_logprobs = logprobs is not None
        self._arrival = time.monotonic()
        self._round = 0
        self._task: asyncio.Task | None = None

    async def start(self) -> BeamSearchStream:
        first = await self._next_round()
        self._task = asyncio.create_task(self._run(first))
        return self

    def __aiter__(self) -> BeamSearchStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished or self._task is None:
            raise StopAsyncIteration
        try:
            return await asyncio.shield(self._task)
        finally:
            if self._task.done():
                self.finished = True

    async def aclose(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.finished = True

    async def _next_round(self) -> list[RequestStream]:
        self._round += 1
        return await self._engine.add_requests([
            (f"{self.request_id}-round{self._round}-beam{i}", self._prompt_ids + beam.tokens,
             {**self._options, "params": self._params})
            for i, beam in enumerate(self._search.running)])

    async def _run(self, streams: list[RequestStream]) -> RequestOutput:
        while True:
            try:
                finals = [await _final(s) for s in streams]
            finally:
                for s in streams:
                    await s.aclose()
            if any(out is None or not out.outputs[0].logprobs for out in finals):
                return self._output([CompletionOutput(index=i, text="", token_ids=[],
                                                      finish_reason="abort")
                                     for i in range(self._search.width)])
            self._search.advance([out.outputs[0].logprobs[0] for out in finals])
            if self._search.done:
                return self._output(completion_outputs(self._search, self._decode,
                                                       self._with_logprobs))
            streams = await self._next_round()

    def _output(self, outputs: list[CompletionOutput]) -> RequestOutput:
        out = RequestOutput(request_id=self.request_id, prompt=None,
                            prompt_token_ids=self._prompt_ids, outputs=outputs, finished=True)
        out.timings.arrival = self._arrival
        out.timings.first_token = out.timings.finished = time.monotonic()
        return out


async def _final(stream: RequestStream) -> RequestOutput | None:
    """A round's request's last output (None if the stream gave none)."""
    last = None
    async for out in stream:
        last = out
    return last
