"""The OpenAI-compatible HTTP server (FastAPI on uvicorn) over the async engine."""
