"""Starts the engine, its front and the HTTP server; stops them on SIGINT/SIGTERM.

Shutdown: uvicorn stops accepting connections, waits up to ``--shutdown-timeout`` seconds for
the answers in progress (then cancels them, which aborts their requests), and the app's
lifespan stops the engine thread. The process then exits 0.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys

logger = logging.getLogger("nanograph")


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from nanograph.serve.app import build_app
    except ImportError as e:
        print(f"error: {e.name} is missing: pip install 'nanograph[serve]'", file=sys.stderr)
        return 2
    from nanograph.cli import engine_config_from
    from nanograph.engine.engine import Engine
    from nanograph.engine.front import EngineFront

    try:
        engine = Engine(engine_config_from(args))
    except (ValueError, FileNotFoundError, MemoryError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    name = args.served_model_name or engine.config.model
    front = EngineFront(engine, max_queue=args.max_queue)
    app = build_app(front, name, args.api_key, args.shutdown_timeout)
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
    server.run()
    engine.close()  # the background capture thread, if one still runs
    return 0 if server.started else 1
