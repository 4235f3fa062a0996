"""Tensor parallelism over torch.distributed: groups, collectives, sharding, rank agreement and
the launch of worker processes (see docs/tensor_parallel.md).

Importing this package imports only torch: models and layers use its collectives and sharding;
the launcher and the worker loop (which import the engine) are imported where they are used.
"""

from __future__ import annotations

from nanograph.distributed.group import TensorParallel, TensorParallelError

__all__ = ["TensorParallel", "TensorParallelError"]
