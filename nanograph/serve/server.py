"""Starts the engine, its front and the HTTP server; stops them on SIGINT/SIGTERM.

Shutdown: uvicorn stops accepting connections, waits up to ``--shutdown-timeout`` seconds for
the answers in progress (then cancels them, which aborts their requests), and the app's
lifespan stops the engine's loop (its child process, or with ``--no-engine-process`` its thread).
The process then exits 0. If the engine's loop ends by itself (its process died), the server
shuts down the same way and exits 1, so that a supervisor can start it again (vLLM's and
SGLang's servers exit then too). The server talks to the engine only through its front.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nanograph.engine.config import EngineConfig
    from nanograph.engine.front import Front

logger = logging.getLogger("nanograph")


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from nanograph.serve.app import build_app
    except ImportError as e:
        print(f"error: {e.name} is missing: pip install 'nanograph[serve]'", file=sys.stderr)
        return 2
    from nanograph.cli import engine_config_from

    if args.enable_auto_tool_choice and args.tool_call_parser is None:  # as vLLM refuses it
        print("error: --enable-auto-tool-choice needs --tool-call-parser (hermes)",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        engine_config = engine_config_from(args)
        front = _front(engine_config, args)
    except (ValueError, FileNotFoundError, MemoryError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    name = args.served_model_name or engine_config.model
    # ``server`` is made below, from the app; the callback runs only once it serves
    app = build_app(front, name, args.api_key, args.shutdown_timeout, args.tool_call_parser,
                    args.reasoning_parser,
                    on_engine_failure=lambda: setattr(server, "should_exit", True))  # fmt: skip
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level="info" if args.verbose else "warning",
        access_log=args.verbose,
        timeout_graceful_shutdown=args.shutdown_timeout,
    )
    server = uvicorn.Server(config)
    # uvicorn re-raises the signal that stopped it once it is done, under the handler that was
    # in place before it started: a no-op handler makes a requested shutdown end with status 0
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    logger.info("serving %s on http://%s:%d/v1", name, args.host, args.port)
    try:
        server.run()
    finally:  # also when uvicorn exits (a port in use): the engine's process must not outlive us
        front.close()  # the engine (and its process or background capture thread), if still up
    return 0 if server.started and not front.failed else 1


def _front(config: EngineConfig, args: argparse.Namespace) -> Front:
    if args.engine_process:
        from nanograph.engine.process_front import ProcessFront

        return ProcessFront(config, max_queue=args.max_queue)
    from nanograph.engine.engine import Engine
    from nanograph.engine.front import EngineFront

    return EngineFront(Engine(config), max_queue=args.max_queue)
