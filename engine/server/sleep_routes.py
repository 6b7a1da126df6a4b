"""Sleep mode over HTTP, in vLLM's shapes: POST /sleep?level=1 (or 2), POST /wake_up
(optionally ?tags=weights&tags=kv_cache), GET /is_sleeping; and the weights read again in
place, in SGLang's shape: POST /update_weights_from_disk {"model_path": PATH} (none: the
model's own), as a trainer beside the server uses them. They exist only with
--enable-sleep-mode (elsewhere: 404), and the API key guards them. Asleep, generation requests
get a 503 and /health stays 200: the process is sound, only resting."""

from __future__ import annotations

from typing import Annotated

from fastapi import FastAPI, Query, Response
from pydantic import BaseModel, ConfigDict

from tokenmill.engine.core.errors import ModelLoadError, SleepModeError
from tokenmill.engine.server.errors import APIError
from tokenmill.engine.server.state import State, check_ready


class WeightsUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model_path: str | None = None  # a checkpoint of the model's shapes; None: its own


def add_sleep_routes(app: FastAPI) -> None:
    @app.post("/sleep")
    async def sleep(state: State, level: int = 1):
        check_ready(state)
        try:
            await state.engine.sleep(level)
        except ValueError as exc:
            raise APIError(400, str(exc), param="level") from exc
        except SleepModeError as exc:
            raise APIError(409, str(exc)) from exc
        return Response(status_code=200)

    @app.post("/wake_up")
    async def wake_up(state: State, tags: Annotated[list[str] | None, Query()] = None):
        check_ready(state)
        try:
            await state.engine.wake_up(tags)
        except ValueError as exc:
            raise APIError(400, str(exc), param="tags") from exc
        return Response(status_code=200)

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(state: State, body: WeightsUpdate | None = None):
        check_ready(state)
        path = body.model_path if body is not None else None
        try:
            await state.engine.reload_weights(path)
        except ValueError as exc:  # quantized weights, which are not read back in place
            raise APIError(400, str(exc)) from exc
        except SleepModeError as exc:
            raise APIError(409, str(exc)) from exc
        except (ModelLoadError, OSError) as exc:
            raise APIError(400, f"model_path: {exc}", param="model_path") from exc
        return {"success": True, "message": f"weights read from {path or 'the model'}"}

    @app.get("/is_sleeping")
    async def is_sleeping(state: State):
        check_ready(state)
        return {"is_sleeping": state.engine.is_sleeping}
