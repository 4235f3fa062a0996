"""The child-to-parent channel of the process front: length-prefixed pickles on a pipe.

Why not ``Connection.send``/``recv``: the parent's receiver thread shares the parent's GIL with
the event loop, which is busy encoding chunks for every stream, and each read releases the GIL
and must win it back. With one message per read, a receiver beside a busy pure-Python thread
took ~1 ms a message on this project's CPU machine (3,000 messages in 3.0 s, the sender blocked
on the full pipe the whole time); reading everything the pipe holds at once took 3,000 in
0.75 s (7 reads, the sender's pickling the limit), and the event loop gets one delivery per
burst. The pipe is also enlarged (best effort, up to Linux's default 1 MiB limit) so the child
does not wait on a receiver a few steps behind.

Invariants:
- A frame is an 8-byte big-endian length and a pickle; ``write_message`` writes it whole (a
  loop over partial writes), so frames never interleave (one writer: the child's loop).
- ``Reader.read`` blocks until at least one message is complete and returns all complete ones,
  in order; it raises ``EOFError`` once the writer is gone and no complete message is left.
- Updates travel as tuples (``to_wire``): pickling 128 ``Update`` objects costs ~10x the
  tuples, and the child pickles on the engine's critical path.
"""

from __future__ import annotations

import os
import pickle
import struct
from collections.abc import Hashable

from nanograph.engine.serving_loop import Update

HEADER = struct.Struct("!Q")
READ_BYTES = 1 << 20
PIPE_BYTES = 1 << 20


def enlarge(fd: int) -> None:
    """Asks Linux for a PIPE_BYTES pipe buffer (64 KiB by default); elsewhere a no-op."""
    try:
        import fcntl

        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except (ImportError, AttributeError, OSError):
        pass  # a smaller pipe only makes the child wait sooner on a slow parent


def write_message(fd: int, message: object) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


class Reader:
    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buffer = bytearray()

    def read(self) -> list:
        messages: list = []
        while not messages:
            chunk = os.read(self.fd, READ_BYTES)
            if not chunk:
                raise EOFError("the engine process closed its pipe")
            self._buffer += chunk
            start = 0
            while len(self._buffer) - start >= HEADER.size:
                (n,) = HEADER.unpack_from(self._buffer, start)
                end = start + HEADER.size + n
                if len(self._buffer) < end:
                    break
                messages.append(pickle.loads(self._buffer[start + HEADER.size : end]))
                start = end
            del self._buffer[:start]
        return messages


def to_wire(key: Hashable, update: Update) -> tuple:
    """``(key, token_ids)`` for a plain token update (nearly all of them), else every field."""
    if (not update.finished and not update.rejected and update.logprobs is None
            and update.prompt_logprobs is None):  # fmt: skip
        return key, update.token_ids
    return (key, update.token_ids, update.finished, update.finish_reason, update.error,
            update.text, update.rejected, update.cached_tokens, update.logprobs,
            update.stop_reason, update.prompt_logprobs)  # fmt: skip


def from_wire(item: tuple) -> tuple[Hashable, Update]:
    return item[0], Update(*item[1:])
