"""The one error a fetch ends in."""

from __future__ import annotations


class ModelFetchError(OSError):
    """A model that could not be fetched. The message is one line naming the model and the
    cause, so an init container's or a pod's last log line says what to fix."""

    def __init__(self, model: str, cause: str):
        super().__init__(f"cannot fetch {model}: {' '.join(cause.split())}")
        self.model = model
