"""``nanograph serve``: an OpenAI-compatible HTTP server over the engine's async front.

Layering: this package imports the engine's front (``nanograph.engine.front``), its prompt and
sampling checks, and nothing below the engine (no runners, no graphs). Needs the ``serve`` extra
(FastAPI, uvicorn, prometheus_client).
"""
