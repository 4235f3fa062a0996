"""Nested outputs: tensors inside tuples, lists, dicts and dataclasses.

Invariants:
- `flatten` lists leaves in a fixed order and also records the shape of the structure (container
  types, lengths, dict keys) as non-tensor leaves, so two flattenings compare equal leaf by leaf
  exactly when they have the same structure and the same non-tensor values.
- `OutputCopy` keeps one destination tensor per tensor leaf; calling it with a fresh output of the
  same structure copies each tensor into its destination and rejects any change of shape, dtype,
  structure or non-tensor value, naming the function that produced it.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import torch


def _is_dataclass_instance(obj: Any) -> bool:
    return dataclasses.is_dataclass(obj) and not isinstance(obj, type)


def flatten(obj: Any, out: list[Any] | None = None) -> list[Any]:
    """Leaves of `obj` in order, with container markers so structure changes are visible."""
    out = [] if out is None else out
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (tuple, list)):
        out.append((type(obj), len(obj)))
        for item in obj:
            flatten(item, out)
    elif isinstance(obj, dict):
        out.append((type(obj), tuple(obj)))
        for item in obj.values():
            flatten(item, out)
    elif _is_dataclass_instance(obj):
        out.append(type(obj))
        for field in dataclasses.fields(obj):
            flatten(getattr(obj, field.name), out)
    else:
        out.append(obj)
    return out


def map_tensors(fn: Callable[[torch.Tensor], Any], obj: Any) -> Any:
    """`obj` rebuilt with every tensor leaf replaced by `fn(leaf)`."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, list):
        return [map_tensors(fn, item) for item in obj]
    if isinstance(obj, tuple):
        items = [map_tensors(fn, item) for item in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    if isinstance(obj, dict):
        new = copy.copy(obj)
        for key, value in obj.items():
            new[key] = map_tensors(fn, value)
        return new
    if _is_dataclass_instance(obj):
        new = copy.copy(obj)
        for field in dataclasses.fields(obj):
            # object.__setattr__ also works on frozen dataclasses.
            object.__setattr__(new, field.name, map_tensors(fn, getattr(obj, field.name)))
        return new
    return obj


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # e.g. ambiguous truth values: treat as changed
        return False


class OutputCopy:
    """Copies fresh outputs of `name` into the destinations kept from its captured output."""

    def __init__(self, name: str, captured: Any, destinations: list[torch.Tensor]) -> None:
        self.name = name
        leaves = flatten(captured)
        tensors = iter(destinations)
        # Per leaf: a destination tensor, or None and the constant it must keep equal to.
        self._dest = [next(tensors) if isinstance(x, torch.Tensor) else None for x in leaves]
        self._const = [None if isinstance(x, torch.Tensor) else x for x in leaves]
        self._single = self._dest[0] if isinstance(captured, torch.Tensor) else None

    def __call__(self, result: Any, skip_same_address: bool = False) -> None:
        if self._single is not None and isinstance(result, torch.Tensor):
            self._copy(self._single, result, skip_same_address)
            return
        leaves = flatten(result)
        if len(leaves) != len(self._dest):
            self._changed("its output structure")
        for dest, const, leaf in zip(self._dest, self._const, leaves, strict=True):
            if dest is None:
                if isinstance(leaf, torch.Tensor) or not _same(const, leaf):
                    self._changed(f"a non-tensor output ({const!r} -> {leaf!r})")
            elif not isinstance(leaf, torch.Tensor):
                self._changed(f"a tensor output into {type(leaf).__name__}")
            else:
                self._copy(dest, leaf, skip_same_address)

    def _copy(self, dest: torch.Tensor, src: torch.Tensor, skip_same_address: bool) -> None:
        if src.shape != dest.shape or src.dtype != dest.dtype:
            self._changed(
                f"a tensor from {tuple(dest.shape)} {dest.dtype} to {tuple(src.shape)} {src.dtype}"
            )
        if skip_same_address and src.data_ptr() == dest.data_ptr():
            return
        dest.copy_(src)

    def _changed(self, what: str) -> None:
        raise RuntimeError(
            f"{self.name} changed {what} between capture and replay; a captured graph's "
            "outputs (and an eager break's) must keep their structure, shapes and non-tensor "
            "values. Return such values through tensors, or capture one graph per variant."
        )
