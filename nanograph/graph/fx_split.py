"""FX splitting for `tc_piecewise`: every split-op call alone in its own submodule.

Invariants:
- ``split_graph`` keeps the traced graph's order; each split-op call becomes a submodule of
  its own and everything between two calls one "piece" (the pieces are what gets compiled and
  captured).
- A split submodule that is exactly one call of a split op (``DirectSplit.of``) runs as a plain
  call of the op's Python implementation: the same function with the same arguments, without
  the dispatcher's bookkeeping (~100 us a call on the dev CPU for a custom op that mutates its
  arguments).
- ``split_fed_inputs`` names the piece arguments a split op produced: they have a fresh address
  every call, so a captured piece copies them into the tensors it captured with.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.fx.passes.split_module import split_module

from nanograph.graph.breaks import SPLIT_IMPLS


def split_graph(
    gm: torch.fx.GraphModule, split_ops: Mapping[Any, str]
) -> tuple[torch.fx.GraphModule, list[str], dict[str, str]]:
    """Split `gm` so that every call to a split op sits alone in its own submodule.

    Returns the split module, the piece submodule names in execution order, and
    {split submodule name: op name}.
    """
    partition: dict[torch.fx.Node, int] = {}
    split_parts: dict[int, str] = {}
    current = 0
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if node.op == "call_function" and node.target in split_ops:
            current += 1
            partition[node] = current
            split_parts[current] = split_ops[node.target]
            current += 1
        else:
            partition[node] = current
    split_gm = split_module(gm, gm, lambda node: partition[node], keep_original_order=True)
    splits = {f"submod_{part}": name for part, name in split_parts.items()}
    pieces = [n.target for n in split_gm.graph.nodes if n.op == "call_module"]
    return split_gm, [p for p in pieces if p not in splits], splits


def split_fed_inputs(split_gm: torch.fx.GraphModule, splits: Mapping[str, str]) -> dict:
    """For each submodule, the positions of its arguments that a split op produced."""

    def from_split(arg: Any) -> bool:
        if not isinstance(arg, torch.fx.Node):
            return False
        if arg.op == "call_module":
            return arg.target in splits
        return arg.target is operator.getitem and from_split(arg.args[0])

    return {
        n.target: tuple(i for i, a in enumerate(n.args) if from_split(a))
        for n in split_gm.graph.nodes
        if n.op == "call_module"
    }


class DirectSplit:
    """A split submodule (placeholders -> one split-op call -> its result) run as a plain call
    of the op's Python implementation, skipping the dispatcher. Same function, same arguments."""

    def __init__(self, impl: Callable[..., Any], spec: tuple, kwargs: dict, returns: bool) -> None:
        self.impl, self.spec, self.kwargs, self.returns = impl, spec, kwargs, returns

    @classmethod
    def of(cls, module: torch.fx.GraphModule) -> DirectSplit | None:
        nodes = list(module.graph.nodes)
        placeholders = [n for n in nodes if n.op == "placeholder"]
        calls = [n for n in nodes if n.op not in ("placeholder", "output")]
        output = nodes[-1]
        if len(calls) != 1 or output.op != "output":
            return None
        # The submodule returns the op's result, or nothing (an op that only mutates inputs).
        returns = output.args[0] is calls[0]
        if not returns and output.args[0] not in ((), None):
            return None
        call = calls[0]
        impl = SPLIT_IMPLS.get(call.target)
        if impl is None or any(isinstance(v, torch.fx.Node) for v in call.kwargs.values()):
            return None
        index = {node: i for i, node in enumerate(placeholders)}
        if any(isinstance(a, torch.fx.Node) and a not in index for a in call.args):
            return None
        # (True, i): the i-th input of the submodule; (False, value): a constant of the trace
        spec = tuple((True, index[a]) if isinstance(a, torch.fx.Node) else (False, a)
                     for a in call.args)  # fmt: skip
        return cls(impl, spec, dict(call.kwargs), returns)

    def __call__(self, *args: Any) -> Any:
        result = self.impl(
            *[args[v] if is_input else v for is_input, v in self.spec], **self.kwargs
        )
        return result if self.returns else ()


def piece_inputs(split_gm: torch.fx.GraphModule, names: list[str], example_inputs: list) -> dict:
    """Fake (symbolic-size) inputs of each piece: the split graph run under dynamo's fake mode."""
    fake_mode = torch._guards.detect_fake_mode()
    if fake_mode is None:  # called outside dynamo (tests calling the compiler directly)
        fake_mode = torch._subclasses.FakeTensorMode(allow_non_fake_inputs=True)
    # dynamo hands real tensors; its fake mode maps them back to the fakes it traced with
    fakes = [fake_mode.from_tensor(x) if isinstance(x, torch.Tensor) else x
             for x in example_inputs]  # fmt: skip
    wanted, seen = set(names), {}

    class Recorder(torch.fx.Interpreter):
        def call_module(self, target: str, args: tuple, kwargs: dict) -> Any:
            if target in wanted:
                seen[target] = args
            return super().call_module(target, args, kwargs)

    with fake_mode:
        Recorder(split_gm).run(*fakes)
    return seen


__all__ = ["DirectSplit", "piece_inputs", "split_fed_inputs", "split_graph"]
