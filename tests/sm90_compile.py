"""Compile every Triton kernel variant the engine launches for sm_90 (H100/H200) on a machine
without a GPU, through the real launch wrappers: each kernel's launch is replaced by a compile.

The interpreter (tests/test_kernels_triton.py) runs kernels as numpy and never sees the
compiler, so errors like a loop-carried dtype change surface only on the device. This catches
them on CPU. Run by tests/test_kernels_compile.py in a process without TRITON_INTERPRET (the
kernels must be real JIT functions); exits non-zero listing the variants that failed.

``python3 tests/sm90_compile.py --sass DIR`` also writes each variant's SASS (Triton's bundled
cuobjdump, addresses and encodings stripped) to DIR, numbered in compile order: diff two trees'
folders to see whether a change to a kernel's source changes what the GPU runs (stop 37 checked
a refactor of a measured kernel this way).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import traceback
from dataclasses import replace

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.tools.tensor_descriptor import TensorDescriptor

from nanograph.kernels import (
    argmax,
    attention,
    attention_tiles,
    draft_inputs,
    fused,
    gemv,
    moe,
    pdl,
    rows,
)
from nanograph.kernels.testing import make_paged_batch

try:  # the Hopper extend (Gluon): compiled where this Triton has Gluon's Hopper layer
    from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor

    from nanograph.kernels import attention_hopper
except ImportError:
    GluonDescriptor = attention_hopper = None

TARGET = GPUTarget("cuda", 90, 32)
SHARED_LIMIT = 232448  # bytes a block may have on H100 and H200 (227 KiB)
POINTER = {
    torch.bfloat16: "*bf16",
    torch.float16: "*fp16",
    torch.float32: "*fp32",
    torch.int32: "*i32",
    torch.int64: "*i64",
    torch.uint8: "*u8",
}


class CompileOnly:
    """Stands in for a ``@triton.jit`` kernel: ``kernel[grid](*args, **kwargs)`` compiles."""

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self.compiled = 0

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            options = {
                k: kwargs.pop(k)
                for k in ("num_warps", "num_stages", "launch_pdl", "maxnreg")
                if k in kwargs
            }
            if "PDL" in kwargs:  # CPU tensors here; on a GPU the PDL branches are the ones run
                kwargs["PDL"] = options["launch_pdl"] = True
            values = dict(zip(self.kernel.arg_names, args))
            values.update(kwargs)
            signature, constexprs, attrs = {}, {}, {}
            aligned = [["tt.divisibility", 16]]
            for i, param in enumerate(self.kernel.params):
                value = values[param.name]
                if param.is_constexpr:
                    signature[param.name] = "constexpr"
                    constexprs[(i,)] = value
                elif isinstance(value, torch.Tensor):
                    signature[param.name] = POINTER[value.dtype]
                    if value.data_ptr() % 16 == 0 and not param.do_not_specialize_on_alignment:
                        attrs[(i,)] = aligned
                elif isinstance(value, TensorDescriptor):
                    block = ",".join(str(b) for b in value.block_shape)
                    signature[param.name] = f"tensordesc<{POINTER[value.base.dtype][1:]}[{block}]>"
                elif GluonDescriptor is not None and isinstance(value, GluonDescriptor):
                    # Gluon's descriptors carry their shared-memory layout in the type
                    dtype = POINTER[value.base.dtype][1:]
                    signature[param.name] = (
                        f"tensordesc<{dtype}{list(value.block_shape)},{value.layout!r}>"
                    )
                elif isinstance(value, bool):
                    signature[param.name] = "i1"
                elif isinstance(value, int):
                    # as a launch specializes: 1 becomes a constant (a unit stride makes a load
                    # contiguous, so vectorizable), multiples of 16 are marked; neither for a
                    # do_not_specialize parameter
                    if value == 1 and not param.do_not_specialize:
                        signature[param.name] = "constexpr"
                        constexprs[(i,)] = 1
                        continue
                    signature[param.name] = "i32" if abs(value) < 2**31 else "i64"
                    if value % 16 == 0 and not param.do_not_specialize:
                        attrs[(i,)] = aligned
                else:
                    signature[param.name] = "fp32"
            # Like a launch, mark 16-byte-aligned pointers and multiples of 16: without these
            # hints the compiler emits no async copies and the variant is not the one that runs.
            source_type = ASTSource
            if GluonDescriptor is not None and isinstance(self.kernel, GluonJITFunction):
                source_type = GluonASTSource
            source = source_type(
                fn=self.kernel, signature=signature, constexprs=constexprs, attrs=attrs
            )
            compiled = triton.compile(source, target=TARGET, options=options)
            if compiled.metadata.shared > SHARED_LIMIT:  # a launch would raise OutOfResources
                raise RuntimeError(f"needs {compiled.metadata.shared} bytes of shared memory, "
                                   f"over sm_90's {SHARED_LIMIT}")  # fmt: skip
            self.compiled += 1
            if SASS_DIR is not None:
                _write_sass(compiled.asm["cubin"], self.kernel.__name__)

        return launch


SASS_DIR: str | None = None
_CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                          "cuobjdump")  # fmt: skip


def _write_sass(cubin: bytes, name: str) -> None:
    index = len(os.listdir(SASS_DIR))
    path = os.path.join(SASS_DIR, f"{index:03d}_{name}")
    with open(path + ".cubin", "wb") as f:
        f.write(cubin)
    sass = subprocess.run([_CUOBJDUMP, "-sass", path + ".cubin"], capture_output=True,
                          text=True, check=True).stdout  # fmt: skip
    os.remove(path + ".cubin")
    with open(path + ".sass", "w") as f:  # instructions only: no addresses, no encodings
        f.write("\n".join(" ".join(re.sub(r"/\*[0-9a-fx]*\*/", "", line).split())
                          for line in sass.splitlines()))  # fmt: skip


def _attention_cases():
    """(name, kwargs for paged_attention) with H200-like tiles (choose_tiles needs CUDA)."""
    gpu_extend = attention_tiles.AttentionTiles(
        block_q=32, group_pad=4, block_n=64, num_splits=1, min_split_blocks=8,
        per_request=False, num_warps=4, num_stages=3,
    )  # fmt: skip
    gpu_decode = attention_tiles.AttentionTiles(
        block_q=1, group_pad=16, block_n=64, num_splits=32, min_split_blocks=1,
        per_request=True, num_warps=4, num_stages=2, one_range=True,
    )  # fmt: skip
    # the prefetching (one to four rows) decode's slices, as choose_tiles sets them on a GPU
    slices = dict(zip(("min_split_blocks", "min_slices"), attention_tiles.ONE_ROW_SLICES))
    sinks = torch.zeros(32, dtype=torch.float32)
    yield "extend", {"tiles": gpu_extend}, None
    yield "extend split", {"tiles": replace(gpu_extend, num_splits=2)}, None
    yield "extend split window sinks softcap", {
        "tiles": replace(gpu_extend, num_splits=4, block_n=32),
        "sliding_window": 128, "sinks": sinks, "softcap": 30.0,
    }, None  # fmt: skip
    yield "extend fp16", {"tiles": replace(gpu_extend, num_splits=2)}, torch.float16
    yield "decode split", {"tiles": gpu_decode, "max_query_len": 1}, None
    yield "decode", {"tiles": replace(gpu_decode, num_splits=1), "max_query_len": 1}, None
    yield "decode split prefetch", {
        "tiles": replace(gpu_decode, prefetch_pages=True, num_warps=8, num_stages=3, **slices),
        "max_query_len": 1,
    }, None  # fmt: skip
    yield "decode one row, a programmatic dependent launch", {
        "tiles": replace(gpu_decode, prefetch_pages=True, num_warps=8, num_stages=3,
                         pdl_wait=True, **slices),
        "max_query_len": 1,
    }, None  # fmt: skip
    yield "extend window prefetch", {
        "tiles": replace(gpu_extend, num_splits=2, prefetch_pages=True), "sliding_window": 100,
    }, None  # fmt: skip
    yield "verify split", {
        "tiles": replace(gpu_decode, block_q=4, group_pad=4, num_splits=2, one_range=False),
        "max_query_len": 4,
    }, None  # fmt: skip
    # this forward's keys from its own rows (TMA): the long-prompt tiles, split and not, and
    # the short-request ones (new_kv: the test's rows, given by main)
    long_new = replace(gpu_extend, block_q=16, new_keys=True)  # 64 rows, 64 keys, 4 warps
    yield "extend new keys", {"tiles": long_new, "new_kv": True}, None
    yield "extend new keys split", {"tiles": replace(long_new, num_splits=2), "new_kv": True}, None
    yield "extend new keys short", {
        "tiles": replace(gpu_extend, block_n=32, new_keys=True), "new_kv": True,
    }, None  # fmt: skip


def main() -> int:
    failures: list[str] = []
    checked = 0
    # Every launch goes through a LaunchCache: give each one a compiling stand-in.
    launches = [attention._launch_attention, fused._launch_norm, fused._launch_silu_and_mul,
                fused._launch_rope_store_kv, gemv._launch, moe._launch_gemm, moe._launch_act,
                moe._launch_pair_gate_up, moe._launch_pair_down, moe._launch_route, rows._launch,
                argmax._launch, draft_inputs._launch]  # fmt: skip
    if attention_hopper is not None:
        launches.append(attention_hopper._launch)
    for launch in launches:
        launch.kernel = CompileOnly(launch.kernel)
    # CPU tensors here: compile the launches a GPU with PDL makes (pdl_wait tiles included)
    pdl.enabled = lambda t: True
    kernels = [launch.kernel for launch in launches]

    def check(name, fn, *args, **kwargs):
        nonlocal checked
        before = sum(k.compiled for k in kernels)
        try:
            fn(*args, **kwargs)
            if sum(k.compiled for k in kernels) == before:
                raise AssertionError("the wrapper launched no kernel: nothing was compiled")
            checked += 1
        except Exception:  # noqa: BLE001 - report every failing variant, then fail
            failures.append(f"{name}:\n{traceback.format_exc(limit=-3)}")

    for name, kwargs, dtype in _attention_cases():
        batch = make_paged_batch(
            [40, 7], [9, 1], num_q_heads=32, num_kv_heads=8, head_dim=128, page_size=16,
            dtype=dtype or torch.bfloat16, num_sentinels=2,
        )  # fmt: skip
        args = (batch.q, batch.k_cache, batch.v_cache, *batch.metadata(), batch.page_size, 0.1)
        if kwargs.get("new_kv"):
            kwargs = {**kwargs, "new_kv": (torch.zeros_like(batch.k_cache[: len(batch.q)]),) * 2}
        check(f"paged_attention {name}", attention.paged_attention, *args, **kwargs)
    if attention_hopper is not None:  # the Gluon extend, as paged_attention launches it on sm_90
        batch = make_paged_batch(
            [40, 7], [200, 130], num_q_heads=16, num_kv_heads=8, head_dim=128, page_size=16,
            dtype=torch.bfloat16, num_sentinels=2,
        )  # fmt: skip
        new = torch.zeros(len(batch.q), 8, 128, dtype=torch.bfloat16)
        new_kv, out = (new, new.clone()), torch.zeros_like(batch.q)
        # CPU tensors: the descriptors without launch_descriptors' device gate
        descriptors = attention_hopper._descriptors(batch.q, new_kv, batch.k_cache,
                                                    batch.v_cache, out)  # fmt: skip
        check("hopper extend_attention", attention_hopper.extend_attention, batch.q, new_kv,
              batch.k_cache, batch.v_cache, *batch.metadata(), 0.1, out, min_q_len=128,
              descriptors=descriptors)  # fmt: skip
    # the fused one-row decode: rotary and the KV store in the attention kernel
    one_row = attention_tiles.AttentionTiles(
        block_q=1, group_pad=16, block_n=64, num_splits=32,
        min_split_blocks=attention_tiles.ONE_ROW_SLICES[0], per_request=True, num_warps=8,
        num_stages=3, prefetch_pages=True, pdl_wait=True,
        min_slices=attention_tiles.ONE_ROW_SLICES[1], one_range=True,
    )  # fmt: skip
    for norm in (False, True):
        batch = make_paged_batch([40], [1], num_q_heads=32, num_kv_heads=8, head_dim=128,
                                 page_size=16, dtype=torch.bfloat16)  # fmt: skip
        k, v = torch.randn(2, 1, 8, 128, dtype=torch.bfloat16)
        weight = torch.ones(128, dtype=torch.bfloat16) if norm else None
        rope = attention.RopeStore(k, v, batch.positions, torch.randn(256, 128),
                                   batch.slot_mapping, weight, weight)  # fmt: skip
        check(f"paged_attention one row with rope norm={norm}", attention.paged_attention,
              batch.q, batch.k_cache, batch.v_cache, *batch.metadata(), batch.page_size, 0.1,
              max_query_len=1, tiles=one_row, rope=rope)  # fmt: skip
    # a decode of several rows (sentinel slots, padded rows) rotating and storing its keys
    batch = make_paged_batch([40, 7, 300], [1, 1, 1], num_q_heads=32, num_kv_heads=8,
                             head_dim=128, page_size=16, dtype=torch.bfloat16, num_sentinels=2,
                             padded_tokens=5)  # fmt: skip
    k, v = torch.randn(2, 5, 8, 128, dtype=torch.bfloat16)
    weight = torch.ones(128, dtype=torch.bfloat16)
    rope = attention.RopeStore(k, v, batch.positions, torch.randn(256, 128), batch.slot_mapping,
                               weight, weight, num_tokens=batch.num_tokens)  # fmt: skip
    check("paged_attention decode rows with rope", attention.paged_attention,
          batch.q, batch.k_cache, batch.v_cache, *batch.metadata(), batch.page_size, 0.1,
          max_query_len=1, rope=rope)  # fmt: skip

    x = torch.randn(4, 1024, dtype=torch.bfloat16)
    w = torch.ones(1024, dtype=torch.bfloat16)
    check("rmsnorm", fused.rmsnorm, x, w, 1e-6)
    check("add_rmsnorm", fused.add_rmsnorm, x, x.clone(), w, 1e-6)
    check("silu_and_mul", fused.silu_and_mul, torch.randn(4, 2048, dtype=torch.bfloat16))
    for norm in (False, True):
        q = torch.randn(4, 32, 128, dtype=torch.bfloat16)
        k, v = torch.randn(2, 4, 8, 128, dtype=torch.bfloat16)
        cache = torch.zeros(64, 8, 128, dtype=torch.bfloat16)
        cos_sin = torch.randn(256, 128)
        weight = torch.ones(128, dtype=torch.bfloat16) if norm else None
        check(
            f"rope_store_kv norm={norm}", fused.rope_store_kv,
            q, k, v, torch.arange(4), cos_sin, cache, cache.clone(), torch.arange(4),
            q_norm_weight=weight, k_norm_weight=weight,
            num_tokens=torch.tensor([4], dtype=torch.int32),
            zero_padding=torch.empty_like(q) if norm else None,
        )  # fmt: skip
    for silu_mul in (False, True):
        # (1 row, 2048-wide K: a MoE router's tiles)
        for tiles in (
            gemv.GemvTiles(),
            gemv.GemvTiles(8, 1024, 4, 3),
            gemv.GemvTiles(1, 2048, 4, 2),
        ):
            x = torch.randn(1, 8192 if silu_mul else 4096, dtype=torch.bfloat16)
            w = torch.randn(1000, 4096, dtype=torch.bfloat16)
            check(f"gemv silu_mul={silu_mul} {tiles}", gemv.gemv, x, w, silu_mul=silu_mul,
                  tiles=tiles)  # fmt: skip
    # the LM head: its tiles, float32 logits rounded to bf16
    x = torch.randn(1, 1024, dtype=torch.bfloat16)
    check("gemv lm_head float32 out", gemv.gemv, x, torch.randn(151936, 1024, dtype=torch.bfloat16),
          out=torch.empty(1, 151936), tiles=gemv.choose_tiles(151936, 1024, 0))  # fmt: skip
    for width in (151936, 1000):
        check(f"argmax {width}", argmax.argmax, torch.randn(3, width))
    # a draft loop's step-to-step inputs (the runner's int64 token rows, int32 lengths and pages)
    tokens, ids, positions, slots = (torch.zeros(3, dtype=torch.long) for _ in range(4))
    seq_lens, table = torch.ones(3, dtype=torch.int32), torch.zeros(8, 20, dtype=torch.int32)
    check("draft inputs", draft_inputs.advance_draft_inputs, tokens, ids, positions, seq_lens,
          slots, table, 16)  # fmt: skip
    # the fused decode's variants: norm prologue (q/k/v, gate/up), residual epilogue (o, down)
    for tiles in (gemv.GemvTiles(), gemv.GemvTiles(4, 512, 8, 4)):
        x = torch.randn(1, 1024, dtype=torch.bfloat16)
        norm = torch.ones(1024, dtype=torch.bfloat16)
        check(f"gemv norm {tiles}", gemv.gemv, x, torch.randn(4096, 1024, dtype=torch.bfloat16),
              norm_weight=norm, eps=1e-6, tiles=tiles)  # fmt: skip
        check(f"gemv norm silu_out {tiles}", gemv.gemv, x,
              torch.randn(6144, 1024, dtype=torch.bfloat16), norm_weight=norm, eps=1e-6,
              silu_out=True, tiles=tiles)  # fmt: skip
        for silu_mul in (False, True):
            x = torch.randn(1, 6144 if silu_mul else 2048, dtype=torch.bfloat16)
            check(f"gemv residual silu_mul={silu_mul} {tiles}", gemv.gemv, x,
                  torch.randn(1024, 3072 if silu_mul else 2048, dtype=torch.bfloat16),
                  silu_mul=silu_mul, residual=torch.zeros(1, 1024, dtype=torch.bfloat16),
                  tiles=tiles)  # fmt: skip
    # a MoE router's: the post-attention norm on load, the normalised row written for the
    # experts (gpt-oss's with a bias); gpt-oss's biased q/k/v (norm) and o (residual)
    bf16 = dict(dtype=torch.bfloat16)
    x, w = torch.randn(1, 2048, **bf16), torch.randn(128, 2048, **bf16)
    router = gemv.GemvTiles(1, 2048, 4, 2)
    for bias in (None, torch.zeros(128, **bf16)):
        check(f"gemv norm normed_out bias={bias is not None}", gemv.gemv, x, w,
              norm_weight=torch.ones(2048, **bf16), bias=bias, normed_out=torch.empty_like(x),
              tiles=router)  # fmt: skip
    x, w = torch.randn(1, 2880, **bf16), torch.randn(5120, 2880, **bf16)
    check("gemv norm bias", gemv.gemv, x, w, norm_weight=torch.ones(2880, **bf16),
          bias=torch.zeros(5120, **bf16), tiles=gemv.GemvTiles())  # fmt: skip
    x, w = torch.randn(1, 4096, **bf16), torch.randn(2880, 4096, **bf16)
    check("gemv residual bias", gemv.gemv, x, w, bias=torch.zeros(2880, **bf16),
          residual=torch.zeros(1, 2880, **bf16), tiles=gemv.GemvTiles(4, 1024, 8, 4))  # fmt: skip
    # the few-row products (a verify, a small decode batch): the tiles choose_tiles takes, one
    # program a weight tile and split-K, plain and with the activation in the epilogue
    # (gate/up: half the rows a program)
    for dtype in (torch.bfloat16, torch.float16):
        for tiles in (
            rows.RowsTiles(), rows.RowsTiles(64, 128, 4, 3), rows.RowsTiles(64, 128, 4, 4),
            rows.RowsTiles(64, 128, 4, 4, split_k=4), rows.RowsTiles(split_k=2),
        ):  # fmt: skip
            x = torch.randn(5, 4096, dtype=dtype)
            check(f"gemm_rows {dtype} {tiles}", rows.gemm_rows, x,
                  torch.randn(6144, 4096, dtype=dtype), tiles=tiles)  # fmt: skip
            # the norm taken in: the stream's sums of squares in 64 parts (qwen3-8b's)
            normed = rows.NormedRows(x, torch.zeros(64, rows.MAX_ROWS), 1e-6)
            check(f"gemm_rows norm {dtype} {tiles}", rows.gemm_rows, x,
                  torch.randn(6144, 4096, dtype=dtype), norm=normed, tiles=tiles)  # fmt: skip
            check(f"gemm_rows residual next_norm {dtype} {tiles}", rows.gemm_rows_normed, x,
                  torch.randn(4096, 4096, dtype=dtype), torch.randn(5, 4096, dtype=dtype),
                  (torch.randn(4096, dtype=dtype), 1e-6), tiles=tiles)  # fmt: skip
            tiles = replace(tiles, block_n=32)
            check(f"gemm_rows silu_out {dtype} {tiles}", rows.gemm_rows, x,
                  torch.randn(2000, 4096, dtype=dtype), silu_out=True, tiles=tiles)  # fmt: skip
            check(f"gemm_rows silu_out norm {dtype} {tiles}", rows.gemm_rows, x,
                  torch.randn(2000, 4096, dtype=dtype), silu_out=True, norm=normed,
                  tiles=tiles)  # fmt: skip
    for name, tokens, experts, top_k, hidden, inter, activation, dtype in (
        ("qwen3-30b-a3b decode", 1, 128, 8, 2048, 768, "silu", torch.bfloat16),
        ("qwen3-30b-a3b prefill", 256, 128, 8, 2048, 768, "silu", torch.bfloat16),
        ("gpt-oss-20b decode", 4, 32, 4, 2880, 2880, "clamped_swiglu", torch.bfloat16),
        ("gpt-oss-20b prefill", 512, 32, 4, 2880, 2880, "clamped_swiglu", torch.bfloat16),
        # past 64 and 128 rows an expert: the large tiles
        ("qwen3-30b-a3b prefill 1600", 1600, 128, 8, 2048, 768, "silu", torch.bfloat16),
        ("gpt-oss-20b prefill 2048", 2048, 32, 4, 2880, 2880, "clamped_swiglu", torch.bfloat16),
        ("fp32 pairwise", 8, 6, 2, 64, 32, "clamped_swiglu", torch.float32),
        ("fp32 sorted", 40, 6, 2, 64, 32, "silu", torch.float32),
        ("fp32 sorted 300", 300, 4, 2, 64, 96, "clamped_swiglu", torch.float32),
    ):
        biases = activation == "clamped_swiglu"
        w13 = torch.zeros(experts, 2 * inter, hidden, dtype=dtype)
        w2 = torch.zeros(experts, hidden, inter, dtype=dtype)
        b13 = torch.zeros(experts, 2 * inter, dtype=dtype) if biases else None
        b2 = torch.zeros(experts, hidden, dtype=dtype) if biases else None
        ids = torch.randint(0, experts, (tokens, top_k))
        weights = torch.ones(tokens, top_k, dtype=dtype)
        # the tiles choose_tiles picks on a GPU for this many (token, expert) pairs
        tiles = moe.choose_tiles(tokens, top_k, experts, hidden, inter, torch.device("cuda"),
                                 dtype)  # fmt: skip
        check(f"fused_experts {name} {tiles}", moe.fused_experts,
              torch.zeros(tokens, hidden, dtype=dtype), w13, w2, b13, b2, weights, ids,
              activation, tiles=tiles)  # fmt: skip
    for experts, top_k, softmax_first, renormalize in ((128, 8, True, True), (32, 4, False, False)):
        logits = torch.zeros(4, experts, dtype=torch.bfloat16)
        check(f"moe route {experts} experts top-{top_k}", moe.route, logits, top_k,
              softmax_first, renormalize)  # fmt: skip
    # gpt-oss' MXFP4 experts (packed codes and scales), decode and prefill
    for name, tokens, experts in (("gpt-oss-20b", 4, 32), ("gpt-oss-120b", 512, 128),
                                  ("gpt-oss-20b", 2048, 32)):  # fmt: skip
        hidden = inter = 2880
        codes13 = torch.zeros(experts, 2 * inter, hidden // 2, dtype=torch.uint8)
        scales13 = torch.zeros(experts, 2 * inter, hidden // 32, dtype=torch.uint8)
        codes2 = torch.zeros(experts, hidden, inter // 2, dtype=torch.uint8)
        scales2 = torch.zeros(experts, hidden, inter // 32, dtype=torch.uint8)
        b13 = torch.zeros(experts, 2 * inter, dtype=torch.bfloat16)
        b2 = torch.zeros(experts, hidden, dtype=torch.bfloat16)
        ids = torch.randint(0, experts, (tokens, 4))
        weights = torch.ones(tokens, 4, dtype=torch.bfloat16)
        tiles = moe.choose_tiles(tokens, 4, experts, hidden, inter, torch.device("cuda"),
                                 mxfp4=True)  # fmt: skip
        check(f"fused_experts {name} MXFP4 {tiles}", moe.fused_experts,
              torch.zeros(tokens, hidden, dtype=torch.bfloat16), codes13, codes2, b13, b2,
              weights, ids, "clamped_swiglu", tiles=tiles, w13_scales=scales13,
              w2_scales=scales2)  # fmt: skip
    print(f"compiled {checked} kernel variants for sm_90; {len(failures)} failed")
    for failure in failures:
        print(failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    if "--sass" in sys.argv:
        SASS_DIR = sys.argv[sys.argv.index("--sass") + 1]
        os.makedirs(SASS_DIR, exist_ok=True)
    raise SystemExit(main())
