"""Frontends over the core: LLM (offline batches) and AsyncEngine (the engine loop on its own
thread, for the server)."""
