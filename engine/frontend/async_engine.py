"""AsyncEngine: the engine loop on its own thread, requests and outputs crossing to asyncio.

The model step is heavy torch work, so it runs on a dedicated thread and the event loop stays
free to accept connections and stream tokens. The loop thread owns the LLMEngine outright:
callers send it commands (add, abort, and calls such as adding a LoRA adapter) through a queue
it drains between steps, and it hands each step's outputs to the event loop in one
call_soon_threadsafe, into each request's OutputSlot (a reader behind by some steps takes them
at once).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from tokenmill.engine.core import (
    LLMEngine,
    PoolingParams,
    RequestOutput,
    RequestOutputKind,
    SamplingParams,
)
from tokenmill.engine.core.errors import EngineDeadError
from tokenmill.engine.frontend.output_slot import OutputSlot

log = logging.getLogger(__name__)

StepObserver = Callable[[LLMEngine, list[RequestOutput]], None]
ADD_OPTIONS = {"params", "cache_salt", "lora_name", "pooling", "priority", "images"}


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    outputs: OutputSlot
    admitted: asyncio.Future


class AsyncEngine:
    def __init__(self, engine: LLMEngine, observer: StepObserver | None = None):
        self.engine = engine
        self._observer = observer
        self._commands: queue.Queue = queue.Queue()
        self._streams: dict[str, _Stream] = {}
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._pending_adds = 0
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    @property
    def num_requests(self) -> int:
        """Requests accepted and not yet finished (queued commands included)."""
        return len(self._streams)

    @property
    def num_waiting(self) -> int:
        """Requests not yet running: the scheduler's queue plus those still being handed over."""
        with self._lock:
            return self.engine.num_waiting + self._pending_adds

    async def add_request(self, request_id: str, prompt: str | list[int],
                          params: SamplingParams | None,
                          cache_salt: str | None = None,
                          lora_name: str | None = None,
                          pooling: PoolingParams | None = None,
                          priority: int = 0, images: list[Any] | None = None) -> RequestStream:
        """Hand a request to the engine; return its output stream once it is admitted.
        An embedding request (the pooling runner) gives `pooling` and no `params`; `images`
        are the prompt's (LLMEngine.prepare_images' output, made off the engine's thread).

        Raises what the engine raised for a request it can't serve (RequestError,
        UnknownAdapterError for a `lora_name` not loaded, ...).
        """
        [stream] = await self.add_requests([(request_id, prompt, {
            "params": params, "cache_salt": cache_salt, "lora_name": lora_name,
            "pooling": pooling, "priority": priority, "images": images})])
        return stream

    async def add_requests(self, requests: list[tuple[str, str | list[int], dict[str, Any]]]
                           ) -> list[RequestStream]:
        """add_request for each (request id, prompt, its keywords), handed to the loop in one
        command: the loop admits what is queued between two steps, so a call of many inputs
        (a batch of embeddings, several prompts) starts in one step, not one step per input.
        If one is refused, or the caller is cancelled, none is kept (the admitted are aborted)
        and the first refusal in order is raised."""
        if not self.alive:
            raise EngineDeadError("the engine loop is not running")
        loop = asyncio.get_running_loop()
        commands, streams = [], []
        for request_id, prompt, options in requests:
            if unknown := set(options) - ADD_OPTIONS:
                raise TypeError(f"add_requests: unknown options {sorted(unknown)}")
            params = options.get("params")
            deltas = params is not None and params.output_kind is RequestOutputKind.DELTA
            stream = _Stream(loop, OutputSlot(loop, merge_deltas=deltas), loop.create_future())
            self._streams[request_id] = stream
            streams.append(stream)
            commands.append(("add", request_id, prompt, params, options.get("cache_salt"),
                             options.get("lora_name"), options.get("pooling"),
                             options.get("priority", 0), options.get("images")))
        with self._lock:
            self._pending_adds += len(commands)
        self._send(("add_many", commands))
        try:
            results = await asyncio.gather(*(s.admitted for s in streams),
                                           return_exceptions=True)
        except BaseException:
            self._drop([request_id for request_id, _, _ in requests])
            raise
        refused = [r for r in results if isinstance(r, BaseException)]
        if refused:
            self._drop([request_id for request_id, _, _ in requests])
            raise refused[0]
        return [RequestStream(self, request_id, stream.outputs)
                for (request_id, _, _), stream in zip(requests, streams, strict=True)]

    def _drop(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            if self._streams.pop(request_id, None) is not None:
                self._send(("abort", request_id))

    def check_logprobs(self, asked: int | None, field: str) -> None:
        """LLMEngine.check_logprobs: reads only the options, so any thread may ask."""
        self.engine.check_logprobs(asked, field)

    async def check_constraint(self, params: SamplingParams) -> None:
        """Compile a request's constraint on a worker thread, off the event loop and off the
        engine loop, before the request is added; RequestError if it does not compile."""
        if params.structured_outputs is not None:
            await asyncio.to_thread(self.engine.check_constraint, params)

    async def generate(self, request_id: str, prompt: str | list[int],
                       params: SamplingParams,
                       lora_name: str | None = None,
                       priority: int = 0) -> AsyncIterator[RequestOutput]:
        """Admit a request and iterate its outputs: one per engine step while the caller
        keeps up, else one for the steps it missed (cumulative, unless params ask for deltas)."""
        stream = await self.add_request(request_id, prompt, params, lora_name=lora_name,
                                        priority=priority)
        try:
            async for out in stream:
                yield out
        finally:
            await stream.aclose()

    async def add_lora(self, name: str, path: str) -> None:
        """Fetch and check a LoRA adapter on a worker thread (a download from s3:// or hf://
        takes as long as it takes, and the engine keeps stepping), then serve it from the
        engine loop's thread (between steps); raises what LLMEngine.add_lora raised
        (LoRAAdapterError)."""
        if not self.alive:
            raise EngineDeadError("the engine loop is not running")
        directory = await asyncio.to_thread(self.engine.fetch_lora, name, path)
        await self._call(self.engine.add_lora, name, path, directory)

    async def remove_lora(self, name: str) -> None:
        """Stop serving an adapter to new requests (LLMEngine.remove_lora), between steps."""
        await self._call(self.engine.remove_lora, name)

    async def sleep(self, level: int) -> None:
        """Sleep mode (LLMEngine.sleep), between steps; raises what it raised."""
        await self._call(self.engine.sleep, level)

    async def wake_up(self, tags: list[str] | None) -> None:
        await self._call(self.engine.wake_up, tags)

    async def reload_weights(self, path: str | None) -> None:
        """LLMEngine.reload_weights, between steps; raises what it raised."""
        await self._call(self.engine.reload_weights, path)

    @property
    def is_sleeping(self) -> bool:
        return self.engine.is_sleeping

    def lora_adapters(self) -> dict[str, str]:
        """{name: path} of the served adapters; a snapshot, read from any thread."""
        return self.engine.lora_adapters()

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run fn(*args) on the engine loop's thread; its result or its exception."""
        if not self.alive:
            raise EngineDeadError("the engine loop is not running")
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self._send(("call", fn, args, loop, done))
        return await done

    def abort(self, request_id: str) -> None:
        """Abort a request; its stream (if still open) receives the final "abort" output."""
        self._send(("abort", request_id))

    def forget(self, request_id: str) -> None:
        """Stop delivering outputs of a request (its reader is gone or done)."""
        self._streams.pop(request_id, None)

    def abort_all(self) -> None:
        for request_id in list(self._streams):
            self.abort(request_id)

    def shutdown(self, wait: bool = True) -> None:
        """Stop the loop (after its current step, waited for up to 30 s unless `wait` is
        False), then the engine's tensor-parallel workers."""
        self._stop.set()
        self._wake.set()
        if wait:
            self._thread.join(timeout=30)
        self.engine.shutdown()

    # ---- engine thread --------------------------------------------------------------------

    def _send(self, command: tuple) -> None:
        self._commands.put(command)
        self._wake.set()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._apply_commands()
                if not self.engine.has_unfinished_requests():
                    self._wake.wait(timeout=0.5)
                    self._wake.clear()
                    continue
                outputs = self.engine.step()
                if self._observer is not None:
                    self._observer(self.engine, outputs)
                self._deliver_step(outputs)
        except BaseException as exc:  # the loop must never die silently
            log.exception("engine loop failed")
            self.error = exc
            dead = EngineDeadError(f"the engine loop failed: {exc!r}")
            for request_id in list(self._streams):
                self._deliver(request_id, dead, admission=True)

    def _apply_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if command[0] == "call":
                self._run_call(*command[1:])
            elif command[0] == "add_many":
                for add in command[1]:
                    self._add(*add[1:])
            else:
                out = self.engine.abort_request(command[1])
                if out is not None:
                    if self._observer is not None:
                        self._observer(self.engine, [out])
                    self._deliver(out.request_id, out)

    def _add(self, request_id: str, prompt: str | list[int], params: SamplingParams | None,
             cache_salt: str | None, lora_name: str | None, pooling: PoolingParams | None,
             priority: int, images: list[Any] | None) -> None:
        try:
            with self._lock:
                self._pending_adds -= 1
                self.engine.add_request(request_id, prompt, params, cache_salt, lora_name,
                                        pooling, priority, images)
        except Exception as exc:  # a bad request fails alone
            self._deliver(request_id, exc, admission=True)
        else:
            self._admit(request_id)

    @staticmethod
    def _run_call(fn: Callable[..., Any], args: tuple, loop: asyncio.AbstractEventLoop,
                  done: asyncio.Future) -> None:
        try:
            result = fn(*args)
        except Exception as exc:  # the caller's error, not the loop's
            loop.call_soon_threadsafe(_settle, done, None, exc)
        else:
            loop.call_soon_threadsafe(_settle, done, result, None)

    def _admit(self, request_id: str) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:
            stream.loop.call_soon_threadsafe(_resolve, stream.admitted, None)
        else:  # the caller went away before admission
            self.engine.abort_request(request_id)

    def _deliver(self, request_id: str, item: Any, admission: bool = False) -> None:
        stream = self._streams.get(request_id)
        if stream is None:
            return
        if admission:
            stream.loop.call_soon_threadsafe(_resolve, stream.admitted, item)
        stream.loop.call_soon_threadsafe(stream.outputs.put, item)

    def _deliver_step(self, outputs: list[RequestOutput]) -> None:
        """A step's outputs, handed to each event loop in one call (one wake-up a step)."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[OutputSlot, RequestOutput]]] = {}
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is not None:
                by_loop.setdefault(stream.loop, []).append((stream.outputs, out))
        for loop, items in by_loop.items():
            loop.call_soon_threadsafe(_put_all, items)


class RequestStream:
    """Outputs of one admitted request. Closing it before the end aborts the request."""

    def __init__(self, engine: AsyncEngine, request_id: str, outputs: OutputSlot):
        self._engine = engine
        self.request_id = request_id
        self._outputs = outputs
        self.finished = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        try:
            item = await self._outputs.get()
        except Exception:  # the request's error (a cancelled reader is closed by aclose)
            self.finished = True
            self._engine.forget(self.request_id)
            raise
        if item.finished:
            self.finished = True
            self._engine.forget(self.request_id)
        return item

    async def aclose(self) -> None:
        if not self.finished:
            self.finished = True
            self._engine.forget(self.request_id)
            self._engine.abort(self.request_id)


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


def _resolve(future: asyncio.Future, error: BaseException | None) -> None:
    _settle(future, None, error)


def _put_all(items: list[tuple[OutputSlot, RequestOutput]]) -> None:
    for slot, output in items:
        slot.put(output)
