"""``nanograph serve``: an OpenAI-compatible HTTP server over the engine's async front.

Layering: this package imports the engine's fronts (``nanograph.engine.process_front``, the
default, and ``nanograph.engine.front`` for ``--no-engine-process``), its prompt and sampling
checks, and nothing below the engine (no runners, no graphs): with either front the server
talks to the engine only through the front. Needs the ``serve`` extra (FastAPI, uvicorn,
prometheus_client).
"""
