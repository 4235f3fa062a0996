"""Elementwise ops of the model, dispatched to fused Triton kernels on CUDA.

Invariants:
- Every op has one torch reference (``nanograph.kernels.reference``) used on CPU; on CUDA the
  fused Triton kernel with the same signature runs. Both are graph-safe: no host reads.
- While torch.compile traces (tc_piecewise), the ops are opaque torch.library custom ops, so
  dynamo records one node per op instead of tracing the Triton launch wrappers; outside
  tracing they are plain calls with no dispatcher overhead.
- ``rope_store_kv`` rotates q/k in place and writes k/v into the paged cache at
  ``slot_mapping`` (slot -1 = padded token, not written). It runs inside the attention op.
- ``linear`` / ``mlp``: on CUDA a one-row product (decode at batch 1) runs the Triton GEMV
  and a product of 2 to ``FEW_ROWS`` rows (a speculative verify of k + 1 tokens at batch 1, a
  small decode batch) the few-row kernel (``kernels.rows``): both stream the weight faster than
  cuBLAS at those shapes (``nanograph bench gemv``, ``--rows``); the MLP's activation goes into
  the down GEMV's prologue (one row) or the gate/up product's epilogue (few rows). A float32
  product on CPU runs on oneDNN with the weight packed once (``_onednn_weight``); every other
  product is ``F.linear``. ``use_triton_gemv(False)`` turns both Triton products off (set it
  before graphs are captured: a graph replays whichever kernel it recorded). Under
  torch.compile they are off, so tc_piecewise keeps one compiled graph for every size.
- Fused decode (``fused_decode_applies``): a one-row forward of a single-GPU layer (by
  default a MoE layer, or a dense one of hidden size up to ``FUSED_DECODE_MAX_HIDDEN``) runs
  ``norm_linear`` (RMSNorm in the GEMV's prologue: q/k/v, gate/up with SiLU-and-mul in its
  epilogue, a MoE router writing the normalised row for its experts) and ``linear_add`` (the
  residual add in the GEMV's epilogue: o and down), projection biases added in the
  epilogues, so the residual stream is one tensor updated in place and no norm kernel runs
  between products.
  ``set_fused_decode("off")`` forces the unfused path (the benchmark's ``:unfused`` arm, the
  comparison tests); "always" runs it for any one-row input and dtype, on CPU through the
  Triton interpreter (tests, with ``TRITON_INTERPRET=1``). Like the GEMV switch, set it before
  graphs are captured.
- Fused few rows (``fused_rows_applies``; ``set_fused_rows``, "auto" on CUDA in bf16 at every
  hidden size): a forward of 2 to ``FEW_ROWS`` rows (a small decode batch, a
  speculative verify, a short prompt) through dense single-GPU layers takes its RMSNorms
  but the first into the few-row products: ``rows_linear_add`` adds o and down into the
  stream and makes it ready for the next norm (the stream times the norm's weight, and its
  rows' sums of squares in parts), ``norm_rows_linear`` multiplies that and scales each
  output row by the stream's 1/rms. Within the dtype's rounding of the unfused path, not
  equal to it.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from nanograph.kernels import reference

if TYPE_CHECKING:  # kernels.rows needs Triton, an optional extra
    from nanograph.kernels.rows import NormedRows

_TRITON_GEMV = True


def use_triton_gemv(on: bool) -> None:
    """Process-wide: one-row and few-row products through the Triton GEMV and few-row kernel
    (True, default) or cuBLAS."""
    global _TRITON_GEMV
    _TRITON_GEMV = on


FUSED_DECODE_MODES = ("auto", "off", "always")
_FUSED_DECODE = "auto"
# "auto" fuses dense layers up to this hidden size, MoE layers at any. The normalising GEMV
# normalises each K block of x in every warp of a program, which slows its stream (ncu,
# qwen3-8b's gate/up: 58.5 against 53.6 us plain): on a dense layer's gate/up at 1024-2048
# that costs less than the norm kernels fusion removes, at 2560 and 4096 more. A MoE layer
# normalises only in q/k/v and its router (small products) and fuses its routing and experts.
# H200, decode graph at batch 1 replayed alone, fused against unfused (stop 42): qwen3-0.6b
# (hidden 1024) 0.704 against 0.773 ms, qwen3-30b-a3b (2048) 2.409 against 2.428, qwen3-8b
# (4096) 4.066-4.104 against 3.927-3.970. H100, bench decode at batch 1, fused / unfused tok/s
# (stop 74): qwen3-4b (2560) 284.7 / 290.0, qwen3-8b 177.8 / 179.3, gpt-oss-20b (MoE, 2880)
# 327.2 / 298.6.
FUSED_DECODE_MAX_HIDDEN = 2048


def set_fused_decode(mode: str) -> None:
    """Process-wide: "auto" (default: with the Triton GEMV, on CUDA in fp16/bf16, hidden size
    up to ``FUSED_DECODE_MAX_HIDDEN`` in a dense layer, any in a MoE layer), "off", or
    "always" (every one-row forward; on CPU only under ``TRITON_INTERPRET=1``)."""
    global _FUSED_DECODE
    if mode not in FUSED_DECODE_MODES:
        raise ValueError(f"fused decode mode {mode!r}: use one of {', '.join(FUSED_DECODE_MODES)}")
    _FUSED_DECODE = mode


# this thread's forwards take the unfused path (start-up's warm-up of every attention variant)
_UNFUSED_HERE: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "nanograph_unfused_decode", default=False
)


@contextlib.contextmanager
def unfused_decode() -> Iterator[None]:
    """Forwards of this thread inside the block take the unfused path, whatever the mode: the
    warm-up compiles every attention variant as the unfused launches use it (the fused
    layer's one-row launch, which also rotates and stores, is its own variant)."""
    token = _UNFUSED_HERE.set(True)
    try:
        yield
    finally:
        _UNFUSED_HERE.reset(token)


def _fusable_stream(x: torch.Tensor, low: int, high: int) -> bool:
    """What both fused paths ask of the residual stream ``x``: ``[low to high rows, hidden]``,
    contiguous rows, not traced by dynamo, not inside ``unfused_decode``. (Comparisons, not
    ``in range``: dynamo evaluates them on a symbolic row count.)"""
    if x.dim() != 2 or not low <= x.shape[0] <= high or x.stride(-1) != 1:
        return False
    if torch.compiler.is_compiling():  # first: dynamo cannot trace the ContextVar read below
        return False
    return not _UNFUSED_HERE.get()


def fused_decode_applies(x: torch.Tensor, *, moe: bool = False) -> bool:
    """Whether a layer (``moe``: with a MoE block for its MLP) fed the one-row residual stream
    ``x`` takes the fused decode path."""
    if _FUSED_DECODE == "off" or not _fusable_stream(x, 1, 1):
        return False
    if _FUSED_DECODE == "always":
        return True
    return (
        _TRITON_GEMV and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16)
        and (moe or x.shape[1] <= FUSED_DECODE_MAX_HIDDEN)
    )  # fmt: skip


FUSED_ROWS_MODES = ("auto", "off", "always")
# "auto" fuses every hidden size. H100, decode graphs at batch 2 / 4 / 8, fused against
# unfused in one run (stop 61, benchmarks/results/h100/stop61_*): qwen3-0.6b +11.5 / +6.1 /
# +8.7% tok/s, qwen3-8b +0.4 / 0.0 / +1.0% (there the norm kernels it removes mostly
# overlapped the next product's weight prefetch under programmatic dependent launch).
_FUSED_ROWS = "auto"


def set_fused_rows(mode: str) -> None:
    """Process-wide: "auto" (default: with the Triton products, on CUDA in bf16), "off", or
    "always" (every forward of 2 to ``FEW_ROWS`` rows through fusable layers; on CPU only under
    ``TRITON_INTERPRET=1``). Set it before graphs are captured."""
    global _FUSED_ROWS
    if mode not in FUSED_ROWS_MODES:
        raise ValueError(f"fused rows mode {mode!r}: use one of {', '.join(FUSED_ROWS_MODES)}")
    _FUSED_ROWS = mode


def fused_rows_applies(x: torch.Tensor) -> bool:
    """Whether layers fed the residual stream rows ``x`` take the fused few-row path."""
    if _FUSED_ROWS == "off" or not _fusable_stream(x, 2, FEW_ROWS):
        return False
    # not fp16 in "auto": the fused path rounds the raw stream times the norm's weight, and
    # a residual stream's outlier features (thousands in some models) times the weight can
    # pass fp16's 65,504 where the normalised row the unfused path rounds cannot
    return _FUSED_ROWS == "always" or (_TRITON_GEMV and x.is_cuda and x.dtype == torch.bfloat16)


def norm_rows_linear(
    normed: NormedRows, weight: torch.Tensor, *, silu_and_mul: bool = False
) -> torch.Tensor:
    """``linear(rmsnorm(stream), weight)`` from the stream made ready by ``rows_linear_add``
    (fused few rows); with ``silu_and_mul`` (weight = packed gate/up) only the MLP's
    activation is written."""
    from nanograph.kernels.rows import gemm_rows

    return gemm_rows(normed.scaled, weight, silu_out=silu_and_mul, norm=normed)


def rows_linear_add(
    x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor,
    next_norm: tuple[torch.Tensor, float] | None = None,
) -> NormedRows | None:  # fmt: skip
    """``residual += linear(x, weight)`` in place (fused few rows); with ``next_norm = (g,
    eps)`` the updated stream made ready for that RMSNorm in the next product."""
    from nanograph.kernels.rows import gemm_rows, gemm_rows_normed

    if next_norm is None:
        gemm_rows(x, weight, residual=residual)
        return None
    return gemm_rows_normed(x, weight, residual, next_norm)


def norm_linear(
    x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
    *, silu_and_mul: bool = False, bias: torch.Tensor | None = None,
    normed_out: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """``linear(rmsnorm(x, norm_weight, eps), weight, bias)`` in one kernel (fused decode
    only); with ``silu_and_mul`` (weight = packed gate/up) only the MLP's activation of it is
    written; ``normed_out`` is also given ``rmsnorm(x, ...)`` (a MoE router's input, which its
    experts read next)."""
    from nanograph.kernels.gemv import gemv

    return gemv(x, weight, norm_weight=norm_weight, eps=eps, silu_out=silu_and_mul, bias=bias,
                normed_out=normed_out)  # fmt: skip


def linear_add(
    x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, *, silu_mul: bool = False,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """``residual += linear(x, weight, bias)`` in place (of ``silu_and_mul(x)`` with
    ``silu_mul``), in one kernel (fused decode only); returns ``residual``."""
    from nanograph.kernels.gemv import gemv

    return gemv(x, weight, silu_mul=silu_mul, residual=residual, bias=bias)


def _triton_rows(x: torch.Tensor, weight: torch.Tensor) -> int:
    """The rows of ``x`` where the Triton products may take ``x @ weight^T``, else 0."""
    ok = (
        _TRITON_GEMV and x.is_cuda and x.dim() == 2
        and x.dtype in (torch.bfloat16, torch.float16) and weight.dtype == x.dtype
        and x.stride(-1) == 1 and weight.stride(-1) == 1
        and not torch.compiler.is_compiling()
    )  # fmt: skip
    return x.shape[0] if ok else 0


# Products of 2 to this many rows go to the few-row kernel (its MMA pads the rows to 16, so its
# time hardly depends on them; a verify of k + 1 <= 8 tokens at batch 1, decode batches <= 8)
FEW_ROWS = 8


# oneDNN's products on prepacked weights; turned off for the process if the op is missing
# (a CPU build without oneDNN) or refuses a weight
_ONEDNN = True
_PACKED_ATTR = "_nanograph_onednn"


def _onednn_weight(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
    """oneDNN's blocked copy of a float32 CPU weight for ``x @ weight.T``, made at the weight's
    first product and kept on it (again if the weight changes in place), or None where the
    plain product runs. Per-call views (an expert's slice of a stacked weight) are not packed:
    each call would pack anew. The copy doubles the weight's memory, so a weight whose copy
    would leave less than PACK_HEADROOM_BYTES of the host's memory available stays unpacked
    (a large float32 model on a small host runs, as before, on ``F.linear``)."""
    global _ONEDNN
    if not (
        _ONEDNN and x.device.type == "cpu" and x.dtype == torch.float32
        and weight.dtype == torch.float32 and x.dim() == 2 and weight.dim() == 2
        and weight._base is None and not x.requires_grad and not weight.requires_grad
        and not torch.compiler.is_compiling()
    ):  # fmt: skip
        return None
    key = (weight.data_ptr(), weight._version)
    cached = getattr(weight, _PACKED_ATTR, None)
    if cached is not None and cached[0] == key:
        return cached[1]
    packed = None  # where memory is short, the weight keeps the plain product
    if _memory_available() >= weight.numel() * weight.element_size() + PACK_HEADROOM_BYTES:
        try:
            # the row count only picks the blocked layout; any row count runs on it
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, 2048)
        except (AttributeError, RuntimeError, NotImplementedError):
            _ONEDNN = False
            return None
    setattr(weight, _PACKED_ATTR, (key, packed))
    return packed


# A weight is packed only while this much memory would remain available after its copy.
PACK_HEADROOM_BYTES = 2 * 2**30


def _memory_available() -> int:
    """The host's available memory in bytes (Linux's MemAvailable; unbounded elsewhere)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None):
    """``F.linear``, through the batch-1 GEMV (one row) or the few-row kernel (2 to FEW_ROWS)
    on CUDA in fp16/bf16, and oneDNN on a prepacked weight on CPU (float32: 1.1-3x faster than
    MKL's sgemm under ``F.linear`` on the development machine, from 1 row to 4,096; the
    weight's memory twice)."""
    rows = _triton_rows(x, weight) if bias is None else 0
    if rows == 1:
        from nanograph.kernels.gemv import gemv

        return gemv(x, weight)
    if 2 <= rows <= FEW_ROWS:
        from nanograph.kernels.rows import gemm_rows

        return gemm_rows(x, weight)
    if not x.is_cuda:  # (CUDA's eager forwards are host-bound: no checks on their path)
        packed = _onednn_weight(x, weight)
        if packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    return F.linear(x, weight, bias)


def logits(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``linear(x, weight).float()``: the LM head's float32 logits. A one-row product writes
    them from the GEMV (rounded to x's dtype first, as the cast would see them), with no cast
    kernel after it."""
    if _triton_rows(x, weight) == 1:
        from nanograph.kernels.gemv import gemv

        out = torch.empty(1, weight.shape[0], dtype=torch.float32, device=x.device)
        return gemv(x, weight, out=out)
    return linear(x, weight).float()


def argmax(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x.argmax(dim=-1)`` of float rows ``[B, V]`` (int64 ``[B]``, the first index of the
    maximum; into ``out`` if given): on CUDA one Triton launch (``kernels/argmax.py``; torch's
    took 8 us and a memset for one 151,936-wide row on the H200), elsewhere torch's."""
    if (x.is_cuda and x.dim() == 2 and x.stride(-1) == 1 and x.is_floating_point()
            and not torch.compiler.is_compiling()):  # fmt: skip
        from nanograph.kernels.argmax import argmax as argmax_rows

        return argmax_rows(x, out=out)
    if out is None:
        return x.argmax(dim=-1)
    return torch.argmax(x, dim=-1, out=out)


def mlp(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """``linear(silu_and_mul(linear(x, gate_up)), down)``: the MLP, ``gate_up`` packed (gate
    rows, then up rows). One row: the activation in the down GEMV's prologue; 2 to FEW_ROWS
    rows: in the gate/up product's epilogue; two products and the activation kernel else."""
    rows = _triton_rows(x, gate_up)
    if rows == 1:
        from nanograph.kernels.gemv import gemv

        return gemv(gemv(x, gate_up), down, silu_mul=True)
    if 2 <= rows <= FEW_ROWS:
        from nanograph.kernels.rows import gemm_rows

        return gemm_rows(gemm_rows(x, gate_up, silu_out=True), down)
    return linear(silu_and_mul(linear(x, gate_up)), down)


def _impl(x: torch.Tensor):
    if x.is_cuda:
        from nanograph.kernels import fused

        return fused
    return reference


@torch.library.custom_op("nanograph::rmsnorm", mutates_args=())
def _rmsnorm_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _impl(x).rmsnorm(x, weight, eps)


@torch.library.custom_op("nanograph::add_rmsnorm", mutates_args=("residual",))
def _add_rmsnorm_op(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    return _impl(x).add_rmsnorm(x, residual, weight, eps)[0]


@torch.library.custom_op("nanograph::silu_and_mul", mutates_args=())
def _silu_and_mul_op(x: torch.Tensor) -> torch.Tensor:
    return _impl(x).silu_and_mul(x)


@_rmsnorm_op.register_fake
def _(x, weight, eps):
    return torch.empty_like(x)


@_add_rmsnorm_op.register_fake
def _(x, residual, weight, eps):
    return torch.empty_like(x)


@_silu_and_mul_op.register_fake
def _(x):
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if torch.compiler.is_compiling():
        return _rmsnorm_op(x, weight, eps)
    return _impl(x).rmsnorm(x, weight, eps)


def add_rmsnorm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """residual += x (in place); returns (rmsnorm(residual), residual)."""
    if torch.compiler.is_compiling():
        return _add_rmsnorm_op(x, residual, weight, eps), residual
    return _impl(x).add_rmsnorm(x, residual, weight, eps)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    if torch.compiler.is_compiling():
        return _silu_and_mul_op(x)
    return _impl(x).silu_and_mul(x)


def rope_store_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    q_norm_weight: torch.Tensor | None = None,
    k_norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    num_tokens: torch.Tensor | None = None,
    zero_padding: torch.Tensor | None = None,
) -> None:
    """``num_tokens`` (device int32 [1]): rows at or past it are padding and are skipped;
    ``zero_padding`` (a tensor like q: the attention output) gets those rows zeroed."""
    _impl(q).rope_store_kv(
        q, k, v, positions, cos_sin_cache, k_cache, v_cache, slot_mapping,
        q_norm_weight=q_norm_weight, k_norm_weight=k_norm_weight, eps=eps, num_tokens=num_tokens,
        zero_padding=zero_padding,
    )  # fmt: skip
