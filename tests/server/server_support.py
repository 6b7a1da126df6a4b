"""Run a real uvicorn server on 127.0.0.1 in a background thread, for tests."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import uvicorn

from tokenmill.engine.server.app import create_app
from tokenmill.engine.server.state import ServerState


@contextlib.contextmanager
def running_server(state: ServerState):
    """Yield the base URL of a server for `state` (whose engine is already loaded)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    app = create_app(state, load_model=False)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("server did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
