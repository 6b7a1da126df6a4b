"""LoRA adapters over HTTP, in vLLM's shapes: a request's `model` picks the base or an adapter,
/v1/models lists both, and with --allow-runtime-lora-updating POST /v1/load_lora_adapter and
/v1/unload_lora_adapter add and remove adapters while the server serves."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict

from tokenmill.engine.core.errors import LoRAAdapterError
from tokenmill.engine.server.errors import APIError
from tokenmill.engine.server.state import ServerState, State, check_ready


class LoadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str
    lora_int_id: int | None = None  # vLLM's field; names identify adapters here


def adapters_of(state: ServerState) -> dict[str, str]:
    """Adapter name -> source as given; none without --enable-lora or before the engine loads."""
    if state.engine is None or not state.config.enable_lora:
        return {}
    return state.engine.lora_adapters()


def resolve_model(state: ServerState, model: str | None) -> str | None:
    """The adapter a request's `model` names (None: the base model); 404 for any other name."""
    if model is None or model in state.options.served_model_names:
        return None
    adapters = adapters_of(state)
    if model in adapters:
        return model
    served = [*state.options.served_model_names, *adapters]
    raise APIError(404, f"the model {model!r} does not exist; this server serves "
                        f"{', '.join(repr(m) for m in served)}", param="model",
                   code="model_not_found")


def model_cards(state: ServerState, created: int) -> list[dict[str, Any]]:
    """/v1/models' entries: the base model under each of its names, then each adapter with the
    base as its parent."""
    base = state.options.served_model_name
    common = {"object": "model", "created": created, "owned_by": "tokenmill",
              "max_model_len": state.max_model_len or None}
    cards = [{"id": name, "root": state.config.model, "parent": None, **common}
             for name in state.options.served_model_names]
    cards += [{"id": name, "root": source, "parent": base, **common}
              for name, source in adapters_of(state).items()]
    return cards


def add_runtime_routes(app: FastAPI) -> None:
    """The load/unload routes, only when runtime updating is allowed (elsewhere they do not
    exist: 404, as in vLLM). They sit under /v1, so the API key guards them."""

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(body: LoadLoRAAdapterRequest, state: State):
        engine = _serving_engine(state)
        if body.lora_name in state.options.served_model_names:
            raise APIError(400, f"lora_name: {body.lora_name!r} is a name of the base model",
                           param="lora_name")
        try:
            await engine.add_lora(body.lora_name, body.lora_path)
        except LoRAAdapterError as exc:
            raise APIError(400, str(exc), param="lora_path") from exc
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(body: UnloadLoRAAdapterRequest, state: State):
        engine = _serving_engine(state)
        if body.lora_name not in engine.lora_adapters():
            raise APIError(404, f"the LoRA adapter {body.lora_name!r} is not loaded",
                           param="lora_name", code="model_not_found")
        try:
            await engine.remove_lora(body.lora_name)
        except LoRAAdapterError as exc:
            raise APIError(404, str(exc), param="lora_name", code="model_not_found") from exc
        return PlainTextResponse(
            f"Success: LoRA adapter '{body.lora_name}' removed successfully.")


def _serving_engine(state: ServerState) -> Any:
    check_ready(state)  # 503 while loading, draining or stopped
    return state.engine
