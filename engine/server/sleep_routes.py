"""Sleep mode over HTTP, in vLLM's shapes: POST /sleep?level=1, POST /wake_up (optionally
?tags=weights&tags=kv_cache), GET /is_sleeping. They exist only with --enable-sleep-mode
(elsewhere: 404), and the API key guards them. Asleep, generation requests get a 503 and
/health stays 200: the process is sound, only resting."""

from __future__ import annotations

from typing import Annotated

from fastapi import FastAPI, Query, Response

from tokenmill.engine.core.errors import SleepModeError
from tokenmill.engine.server.errors import APIError
from tokenmill.engine.server.state import State, check_ready


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

    @app.get("/is_sleeping")
    async def is_sleeping(state: State):
        check_ready(state)
        return {"is_sleeping": state.engine.is_sleeping}
