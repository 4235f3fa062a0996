"""nanograph.graph: one interface for eager, full, breakable (BCG) and tc_piecewise graphs.

Engine-agnostic: imports only torch, and importing it touches no CUDA. Any PyTorch code can use
it. Typical use::

    from nanograph.graph import eager_on_graph, get_backend, new_pool

    @eager_on_graph                       # runs eagerly between graph segments
    def plan_and_attend(q, lengths): ...  # may sync with the host, have dynamic shapes, ...

    pool = new_pool()                     # one per runner, shared by every captured shape
    graph, out = get_backend("breakable").capture(lambda: model(static_ids), pool=pool)
    static_ids.copy_(next_ids)            # refill static inputs in place
    graph.replay()                        # recomputes `out` in place
    print(graph, graph.stats)             # segments, breaks by name, capture time, pool bytes

Split ops: one declaration that is an eager break under `breakable` and a split point under
`tc_piecewise`. Custom ops take tensors and scalars only, so an attention op that needs
per-batch metadata receives tensors (and e.g. the layer index) and reads the metadata from
caller-owned state when it runs; split ops always run eagerly, so that state is current::

    class AttentionState:                 # owned by the runner; refilled before each replay
        plan = None

    STATE = AttentionState()

    @split_op("mylib::attend", mutates_args=())
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
        return varlen_attention(q, k, v, STATE.plan, layer)   # output shaped like q

The runner prepares `STATE.plan` (host-side planning, metadata in its static buffers) outside the
graph, then calls `graph.replay()`. See docs/graph.md for the design.
"""

from __future__ import annotations

from nanograph.graph.base import BACKEND_NAMES, Backend, Graph, GraphCaptureError, GraphStats
from nanograph.graph.breaks import eager_on_graph, split_op
from nanograph.graph.factory import get_backend
from nanograph.graph.memory import GraphPool, new_pool, weak_alias

__all__ = [
    "BACKEND_NAMES",
    "Backend",
    "Graph",
    "GraphCaptureError",
    "GraphPool",
    "GraphStats",
    "eager_on_graph",
    "get_backend",
    "new_pool",
    "split_op",
    "weak_alias",
]
