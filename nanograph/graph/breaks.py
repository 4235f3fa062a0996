"""Eager breaks (`eager_on_graph`) and split ops (`split_op`): code that runs outside graphs.

Invariants:
- Outside a breakable capture, an `eager_on_graph` function is an ordinary call (one contextvar
  read and one `is_compiling()` check of overhead). While dynamo traces, the wrapper is
  transparent: the function body is traced like any other code.
- During a breakable capture, the active handler (breakable.py) decides what the call does. The
  handler is cleared while a break runs, so breaks nested in a break are ordinary calls.
- A `split_op` is one declaration for both graph backends that keep code eager: under
  `breakable` it is an eager break; under `tc_piecewise` it is a torch.library custom op that
  dynamo records as a single FX node, and the FX graph is split there. Its Python body is the
  op's implementation in both cases, so the two paths run the same code.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

F = TypeVar("F", bound=Callable[..., Any])

# handler(fn, capture_stub, args, kwargs) -> output; set by a breakable capture in progress.
BreakHandler = Callable[[Callable[..., Any], Callable[..., Any] | None, tuple, dict], Any]
break_handler: contextvars.ContextVar[BreakHandler | None] = contextvars.ContextVar(
    "nanograph_break_handler", default=None
)
# True while tc_piecewise captures: split ops then run their capture_stub, if they have one.
use_capture_stub: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "nanograph_use_capture_stub", default=False
)
# Every split op declared in this process: OpOverload -> qualified name ("ns::name").
SPLIT_OPS: dict[torch._ops.OpOverload, str] = {}
# ... and -> its Python implementation, which tc_piecewise calls directly at replay: the
# dispatcher path of a custom op that mutates arguments costs ~50 us a call (version bumps,
# default filling), more than the op's own launches.
SPLIT_IMPLS: dict[torch._ops.OpOverload, Callable[..., Any]] = {}


def break_name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


def eager_on_graph(
    fn: F | None = None,
    *,
    enable: bool = True,
    capture_stub: Callable[..., Any] | None = None,
) -> Any:
    """Mark `fn` as an eager break: it never runs inside a CUDA graph under `breakable`.

    Use bare (`@eager_on_graph`) or with options (`@eager_on_graph(enable=flag,
    capture_stub=stub)`). With `enable=False` the function is returned unchanged (captured inline
    like any other code). `capture_stub`, if given, runs instead of `fn` while capturing: it must
    return outputs of the same structure, shapes and dtypes (only their addresses matter then).
    """

    def decorate(f: F) -> F:
        if not enable:
            return f

        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            handler = break_handler.get()
            if handler is None or torch.compiler.is_compiling():
                return f(*args, **kwargs)
            return handler(f, capture_stub, args, kwargs)

        wrapper.__nanograph_break__ = f  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate(fn) if fn is not None else decorate


def _fake_like_first_tensor(*args: Any, **kwargs: Any) -> torch.Tensor:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return torch.empty_like(value)
    raise TypeError("split_op without `fake=`: the default fake needs a tensor argument")


def split_op(
    name: str,
    *,
    fake: Callable[..., Any] | None = None,
    mutates_args: Sequence[str] | str = (),
    capture_stub: Callable[..., Any] | None = None,
) -> Callable[[F], F]:
    """Declare `fn` as an eager break (breakable) and a split point (tc_piecewise) at once.

    `name` is the custom op's name, "namespace::op" (default namespace "nanograph"). `fn` must
    be typed like a torch.library custom op (Tensors, ints, floats, bools, strs, lists of them;
    returns a Tensor, a tuple of Tensors, never an alias of an input, or None). An op that
    writes its result into a caller-allocated argument (listed in `mutates_args`) and returns
    None is the cheapest break: there is no output to copy out at replay. `fake` computes output
    metadata for tracing; by default the output is shaped like the first tensor argument.
    `mutates_args` names the tensor arguments `fn` writes in place. Anything else the op needs
    (attention metadata, KV cache, a host-side plan) it reads from caller-owned state when it
    runs: split ops always run eagerly, so that state is current at every replay.
    """
    qualname = name if "::" in name else f"nanograph::{name}"
    namespace, op_name = qualname.split("::")

    def decorate(fn: F) -> F:
        @functools.wraps(fn)  # custom_op infers the schema from fn's signature through this
        def implementation(*args: Any, **kwargs: Any) -> Any:
            if capture_stub is not None and use_capture_stub.get():
                return capture_stub(*args, **kwargs)
            return fn(*args, **kwargs)

        op = torch.library.custom_op(qualname, mutates_args=mutates_args)(implementation)
        op.register_fake(fake or _fake_like_first_tensor)
        overload = getattr(getattr(torch.ops, namespace), op_name).default
        SPLIT_OPS[overload] = qualname
        SPLIT_IMPLS[overload] = implementation
        as_break = eager_on_graph(fn, capture_stub=capture_stub)

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            if torch.compiler.is_compiling():
                return overload(*args, **kwargs)  # one FX node: tc_piecewise splits here
            return as_break(*args, **kwargs)

        call.op = overload  # type: ignore[attr-defined]
        return call  # type: ignore[return-value]

    return decorate
