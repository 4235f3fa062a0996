"""The Triton kernels under TRITON_INTERPRET=1 (CPU) against float64 torch references.

TRITON_INTERPRET is read when a kernel is decorated, i.e. when
``nanograph.kernels.attention_kernel`` or ``.fused`` is imported, so it is set here before
they are imported (and they are reloaded if something imported them earlier: the kernel's
module before ``.attention``, which binds it). On a machine with CUDA this module is skipped:
tests/gpu run the compiled kernels there, and setting the variable would turn them into
interpreted ones.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys

import pytest
import torch

if torch.cuda.is_available():
    pytest.skip("CUDA present: tests/gpu cover the compiled kernels", allow_module_level=True)
os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")


def _import_interpreted(name: str):
    already = name in sys.modules
    module = importlib.import_module(name)
    return importlib.reload(module) if already else module


_import_interpreted("nanograph.kernels.attention_kernel")
attention = _import_interpreted("nanograph.kernels.attention")
fused = _import_interpreted("nanograph.kernels.fused")
gemv = _import_interpreted("nanograph.kernels.gemv")
rows = _import_interpreted("nanograph.kernels.rows")
from nanograph.kernels import attention_tiles, reference  # noqa: E402
from nanograph.kernels.counters import split_counters  # noqa: E402
from nanograph.kernels.testing import make_paged_batch  # noqa: E402

TOLERANCE = {torch.float32: 2e-4, torch.float16: 3e-3, torch.bfloat16: 3e-2}


def _f64(t: torch.Tensor | None) -> torch.Tensor | None:
    return t.double() if t is not None and t.is_floating_point() else t


def _check_attention(batch, dtype: torch.dtype, **kwargs) -> None:
    scale = batch.q.shape[-1] ** -0.5
    args = (batch.q, batch.k_cache, batch.v_cache, *batch.metadata(), batch.page_size, scale)
    got = attention.paged_attention(*args, **kwargs)
    ref_kwargs = {k: _f64(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()
                  if k != "new_kv"}  # fmt: skip
    want = reference.paged_attention(*[_f64(a) for a in args[:3]], *args[3:], **ref_kwargs)
    real = int(batch.num_tokens[0])
    torch.testing.assert_close(
        got[:real].double(), want[:real], atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype]
    )
    assert torch.all(got[real:] == 0), "padded rows must not be written"


def _batch(contexts, queries, *, q_heads=4, kv_heads=2, head_dim=16, page_size=4, dtype=None,
           sentinels=2, pad=3, seed=0):  # fmt: skip
    return make_paged_batch(
        contexts,
        queries,
        num_q_heads=q_heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        page_size=page_size,
        dtype=dtype or torch.float32,
        num_sentinels=sentinels,
        padded_tokens=sum(queries) + pad,
        generator=torch.Generator().manual_seed(seed),
    )


# -- paged attention: extend (flat grid) ------------------------------------------------------


@pytest.mark.parametrize("num_splits", [1, 4])
def test_extend_mixed_prefix_lengths_and_sentinels(num_splits):
    # a fresh prompt, prefixes that end mid-page and mid-block, a one-token extend, a long one
    batch = _batch([0, 5, 13, 37], [7, 3, 1, 20])
    _check_attention(batch, torch.float32, num_splits=num_splits)


@pytest.mark.parametrize(
    ("q_heads", "kv_heads", "head_dim", "page_size", "dtype"),
    [
        (6, 2, 32, 3, torch.float16),  # group 3 (padded to 4), odd page size
        (2, 2, 16, 8, torch.float32),  # plain MHA
        (8, 1, 16, 1, torch.float32),  # MQA, token-granular pages
        # no bf16 here: the interpreter's tl.dot misreads bf16 operands (triton 3.9); tests/gpu
        # cover bf16 with the compiled kernel
    ],
)
def test_extend_head_layouts_and_dtypes(q_heads, kv_heads, head_dim, page_size, dtype):
    batch = _batch([9, 0, 21], [6, 11, 2], q_heads=q_heads, kv_heads=kv_heads,
                   head_dim=head_dim, page_size=page_size, dtype=dtype, seed=1)  # fmt: skip
    _check_attention(batch, dtype)


def _new_rows(batch):
    """This forward's keys and values as rows ``[N, Hkv, D]``: what rope_store_kv stored in
    the cache (which keeps them: the diagonal key blocks read it), the padded rows NaN."""
    live = batch.slot_mapping >= 0
    k, v = (torch.full((len(live), *c.shape[1:]), float("nan"), dtype=c.dtype)
            for c in (batch.k_cache, batch.v_cache))  # fmt: skip
    slots = batch.slot_mapping[live]
    k[live], v[live] = batch.k_cache[slots], batch.v_cache[slots]
    return k, v


@pytest.mark.parametrize(
    "features",
    [
        {"sliding_window": 5},
        {"sliding_window": 19, "num_splits": 2},
        {"sinks": "random"},
        {"softcap": 3.0},
        {"sliding_window": 7, "sinks": "random", "softcap": 5.0, "num_splits": 4},
    ],
    ids=["window", "window-split", "sinks", "softcap", "all-split"],
)
@pytest.mark.parametrize("new_keys", [False, True], ids=["pages", "new-keys"])
def test_extend_model_features(features, new_keys):
    """Windows, sinks, softcap and splits, with the keys from the pages, or this forward's from
    its rows (``new_kv``; a launch with a window reads the pages anyway)."""
    batch = _batch([0, 30, 12], [17, 4, 9], seed=2)
    kwargs = dict(features)
    if kwargs.get("sinks") == "random":
        kwargs["sinks"] = torch.randn(4, generator=torch.Generator().manual_seed(3)) * 2
    if new_keys:
        kwargs["new_kv"] = _new_rows(batch)
    _check_attention(batch, torch.float32, **kwargs)


@pytest.mark.parametrize("num_splits", [1, 4])
@pytest.mark.parametrize(
    ("contexts", "queries", "q_heads", "kv_heads", "head_dim", "page_size", "dtype"),
    [
        # fresh prompts: every key from the rows; one longer than a key block, several blocks
        ([0, 0], [37, 5], 4, 2, 16, 4, torch.float32),
        # prefixes ending mid-page and mid-block, a one-token extend, an empty sentinel between
        ([5, 13, 0, 37], [20, 1, 33, 7], 4, 2, 16, 4, torch.float32),
        ([9, 0, 21], [6, 40, 2], 6, 2, 32, 3, torch.float16),  # group 3 (padded), odd pages
        ([16, 3], [64, 17], 8, 1, 16, 1, torch.float32),  # MQA, prefix a whole key block
    ],
)  # fmt: skip
def test_extend_reads_new_keys_from_their_rows(
    contexts, queries, q_heads, kv_heads, head_dim, page_size, dtype, num_splits
):
    """An extend given ``new_kv`` reads each request's keys past its cached prefix from those
    rows (the padded rows hold NaN) and its prefix from the pages, split or not."""
    batch = _batch(contexts, queries, q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim,
                   page_size=page_size, dtype=dtype, seed=sum(contexts))  # fmt: skip
    tiles = attention_tiles.choose_tiles(batch.q.device, len(batch.q), len(contexts) + 2, q_heads,
                                   kv_heads, head_dim, None)  # fmt: skip
    assert tiles.new_keys
    _check_attention(batch, dtype, new_kv=_new_rows(batch), num_splits=num_splits)


class _StandInHopper:
    """Stands in for the Hopper extend (sm_90 only; ``kernels.attention.hopper_extend`` returns
    its launch): writes the reference rows of the requests of at least ``min_q_len`` tokens, as
    the Gluon kernel does."""

    def __init__(self, want: torch.Tensor) -> None:
        self.want = want
        self.calls: list[int] = []

    def extend_attention(self, q, new_kv, k_cache, v_cache, page_table, seq_lens, query_lens,
                         query_start_loc, scale, out, min_q_len):  # fmt: skip
        self.calls.append(min_q_len)
        for r, n in enumerate(query_lens.tolist()):
            if n >= min_q_len:
                rows = slice(int(query_start_loc[r]), int(query_start_loc[r]) + n)
                out[rows] = self.want[rows].to(out.dtype)


@pytest.mark.parametrize(
    ("max_query_len", "query_len_range", "hopper_min"),
    [(None, None, 8), (60, None, 8), (7, None, None), (None, (10, 2**31 - 1), 10),
     (None, (0, 5), None)],
)  # fmt: skip
def test_extend_splits_its_requests_between_hopper_and_triton(
    monkeypatch, max_query_len, query_len_range, hopper_min
):
    """Where the Hopper extend supports a batch, it takes the requests of at least
    HOPPER_MIN_QUERY_LEN tokens (8 here) within the call's query_len range, and the Triton
    launches the rest; with a static hint below that length (decode, verify) it is not asked."""
    batch = _batch([0, 5, 30, 0, 2], [20, 8, 7, 1, 9], seed=11)
    args = (batch.q, batch.k_cache, batch.v_cache, *batch.metadata(), batch.page_size, 0.25)
    want = reference.paged_attention(*[_f64(a) for a in args[:3]], *args[3:])
    hopper = _StandInHopper(want)
    monkeypatch.setattr(attention, "hopper_extend", lambda *a: hopper.extend_attention)
    monkeypatch.setattr(attention, "HOPPER_MIN_QUERY_LEN", 8)
    monkeypatch.setattr(attention, "_LAUNCHED", _EveryKind())  # empty launches are left out
    kwargs = {"new_kv": _new_rows(batch), "max_query_len": max_query_len}
    if query_len_range is not None:
        kwargs["query_len_range"] = query_len_range
    got = attention.paged_attention(*args, **kwargs)
    assert hopper.calls == ([hopper_min] if hopper_min is not None else [])
    lo, hi = query_len_range or (0, 2**31 - 1)
    cap = max_query_len or 2**31 - 1
    for r, n in enumerate(batch.query_lens.tolist()[:5]):
        rows = slice(int(batch.query_start_loc[r]), int(batch.query_start_loc[r]) + n)
        if lo <= n <= hi and n <= cap:
            torch.testing.assert_close(got[rows].double(), want[rows], atol=2e-4, rtol=2e-4)
        elif n > cap:
            continue  # past the static hint: not computed, by contract
        else:
            assert torch.all(got[rows] == 0), f"request {r} is outside the call's range"


class _EveryKind(set):
    """``kernels.attention._LAUNCHED`` as if every launch kind had run in this process."""

    def __contains__(self, kind) -> bool:
        return True


def test_extend_leaves_out_launches_without_requests_once_their_kind_ran(monkeypatch):
    """Given the live batch's range (an eager call), a launch whose share of it is empty runs
    the first time its kind is seen (it loads the kernel, which a later capture could not),
    and is left out from then on; a range that holds requests always launches."""
    from conftest import record_attention_launch_ranges

    batch = _batch([0, 5], [20, 9], seed=12)
    args = (batch.q, batch.k_cache, batch.v_cache, *batch.metadata(), batch.page_size, 0.25)
    want = reference.paged_attention(*[_f64(a) for a in args[:3]], *args[3:])
    hopper = _StandInHopper(want)
    monkeypatch.setattr(attention, "hopper_extend", lambda *a: hopper.extend_attention)
    monkeypatch.setattr(attention, "HOPPER_MIN_QUERY_LEN", 8)
    launches = record_attention_launch_ranges(monkeypatch)
    kwargs = {"new_kv": _new_rows(batch), "query_len_range": (9, 20)}  # both long
    for call in range(2):
        got = attention.paged_attention(*args, **kwargs)
        real = int(batch.num_tokens[0])
        torch.testing.assert_close(got[:real].double(), want[:real], atol=2e-4, rtol=2e-4)
        assert hopper.calls == [9] * (call + 1)
        assert launches == [(9, 7)], "Triton's empty launch runs once, for its kind"
    hopper.calls.clear()
    launches.clear()
    kwargs["query_len_range"] = (1, 5)  # short requests only: Hopper's kind already ran
    attention.paged_attention(*args, **kwargs)
    assert hopper.calls == [] and launches == [(1, 5)]


def test_an_eager_extend_passes_its_live_batchs_range():
    """The Triton backend's range for an eager extend: the shortest and longest live request
    (sentinel slots hold 0); every length for a decode or a batch without live requests."""
    from types import SimpleNamespace

    from nanograph.attention.triton_backend import live_query_lens

    q = torch.zeros(4, 2, 8)
    meta = SimpleNamespace(max_query_len=300, query_lens_cpu=[256, 0, 17, 0])
    assert live_query_lens(meta, q) == (17, 256)
    meta.query_lens_cpu[:] = [0, 0, 0, 0]  # a runner updates the list in place
    assert live_query_lens(meta, q) is None
    assert live_query_lens(SimpleNamespace(max_query_len=1, query_lens_cpu=[1, 1]), q) is None


def test_extend_new_keys_come_from_the_rows_but_the_diagonal_blocks():
    """With NaN rows, a tile's output turns NaN exactly when it sees a whole block of this
    forward's keys (read from the rows); the first tile of a fresh prompt sees only its
    diagonal block (read from the cache, where a masked key past the request reads as zero)."""
    batch = _batch([0], [37], seed=6)
    tiles = attention_tiles.choose_tiles(batch.q.device, len(batch.q), 3, 4, 2, 16, None)
    assert (tiles.block_q, tiles.block_n) == (8, 16)  # tokens 16 on see key block 0 whole
    nan_rows = torch.full((len(batch.q), 2, 16), float("nan"))
    got = attention.paged_attention(batch.q, batch.k_cache, batch.v_cache, *batch.metadata(),
                                    batch.page_size, 0.25, new_kv=(nan_rows, nan_rows))  # fmt: skip
    assert not got[:16].isnan().any() and got[16:37].isnan().all()


def test_extend_new_keys_fall_back_to_the_cache():
    """Under a sliding window, and for rows whose layout TMA cannot read (heads not
    contiguous), the keys come from the cache: rows holding NaN do not reach the output."""
    batch = _batch([0, 30, 12], [17, 4, 9], seed=4)
    n, hkv, d = len(batch.q), batch.k_cache.shape[1], batch.k_cache.shape[2]
    nan_rows = torch.full((n, hkv, d), float("nan"))
    strided = torch.full((n, d, hkv), float("nan")).transpose(1, 2)  # stride(1) == 1, not d
    for kwargs in ({"new_kv": (nan_rows, nan_rows), "sliding_window": 6},
                   {"new_kv": (strided, strided)}):  # fmt: skip
        _check_attention(batch, torch.float32, **kwargs)


def test_extend_new_keys_refuses_rows_unlike_q():
    batch = _batch([0, 3], [5, 2], seed=5)
    rows = torch.zeros(len(batch.q) - 1, 2, 16)
    with pytest.raises(ValueError, match="a row per row of q"):
        attention.paged_attention(batch.q, batch.k_cache, batch.v_cache, *batch.metadata(),
                                  batch.page_size, 0.25, new_kv=(rows, rows))  # fmt: skip


# -- paged attention: decode and target-verify (per-request grid) -----------------------------


@pytest.mark.parametrize("num_splits", [1, 8, 32])
def test_decode(num_splits):
    # 0: the first generated token sees only itself; 300 keys fill 19 of 32 slices, more than
    # one chunk of the merge's unrolled loop
    contexts = [0, 3, 16, 47, 8, 29, 300]
    batch = _batch(contexts, [1] * len(contexts), sentinels=3, seed=4)
    _check_attention(batch, torch.float32, max_query_len=1, num_splits=num_splits)


@pytest.mark.parametrize(
    "features",
    [{"sliding_window": 6}, {"sinks": "random"}, {"softcap": 2.5, "sliding_window": 20}],
    ids=["window", "sinks", "softcap-window"],
)
def test_decode_model_features_split(features):
    contexts = [2, 40, 17, 33]
    batch = _batch(contexts, [1] * len(contexts), q_heads=6, kv_heads=2, seed=5)
    kwargs = dict(features)
    if kwargs.get("sinks") == "random":
        kwargs["sinks"] = torch.randn(6, generator=torch.Generator().manual_seed(6)) * 2
    _check_attention(batch, torch.float32, max_query_len=1, num_splits=4, **kwargs)


@pytest.mark.parametrize("num_splits", [1, 2])
def test_target_verify(num_splits):
    # k+1 = 4 draft-check tokens per request; one request carries fewer (end of a budget)
    batch = _batch([12, 0, 25, 5], [4, 4, 2, 4], seed=7)
    _check_attention(batch, torch.float32, max_query_len=4, num_splits=num_splits)


def test_split_counters_reset_and_min_split_blocks():
    # The last slice of each tile merges and re-zeroes its counter, so back-to-back launches
    # (a graph replay, the next layer) start from zero; a key range shorter than
    # min_split_blocks x block_n runs as one slice whatever num_splits allows, unless
    # min_slices keeps it cut into that many shorter slices.
    from dataclasses import replace

    batch = _batch([5, 40, 0, 23], [3, 9, 6, 1], seed=11)
    scale = batch.q.shape[-1] ** -0.5
    args = (batch.q, batch.k_cache, batch.v_cache, *batch.metadata(), batch.page_size, scale)
    base = attention_tiles.choose_tiles(torch.device("cpu"), batch.q.shape[0], 6, 4, 2, 16, None, 4)
    want = reference.paged_attention(*[_f64(a) for a in args[:3]], *args[3:])
    real = int(batch.num_tokens[0])
    variants = (base, base, replace(base, min_split_blocks=100),
                replace(base, min_split_blocks=3, min_slices=2),
                replace(base, min_split_blocks=2, min_slices=4))  # fmt: skip
    for tiles in variants:
        got = attention.paged_attention(*args, tiles=tiles)
        torch.testing.assert_close(got[:real].double(), want[:real], atol=2e-4, rtol=2e-4)
        counters = split_counters(batch.q.device, 0)
        assert int(counters.abs().sum()) == 0


@pytest.mark.parametrize("max_query_len", [None, 1])
def test_page_prefetch_variant_matches_reference(max_query_len):
    # tiles.prefetch_pages loads the next key block's page ids one iteration ahead: the same
    # keys, so the same result, with windows, splits and partial last blocks
    from dataclasses import replace

    queries = [1, 1, 1, 1] if max_query_len == 1 else [3, 9, 6, 1]
    batch = _batch([5, 90, 0, 53], queries, seed=12)  # several key blocks per slice
    scale = batch.q.shape[-1] ** -0.5
    args = (batch.q, batch.k_cache, batch.v_cache, *batch.metadata(), batch.page_size, scale)
    n = batch.q.shape[0]
    for splits, window in ((1, 0), (2, 0), (1, 37)):
        base = attention_tiles.choose_tiles(
            torch.device("cpu"), n, 4, 4, 2, 16, max_query_len, splits
        )
        want = reference.paged_attention(
            *[_f64(a) for a in args[:3]], *args[3:], sliding_window=window
        )
        got = attention.paged_attention(
            *args, tiles=replace(base, prefetch_pages=True), sliding_window=window,
            max_query_len=max_query_len,
        )  # fmt: skip
        real = int(batch.num_tokens[0])
        torch.testing.assert_close(got[:real].double(), want[:real], atol=2e-4, rtol=2e-4)


def test_preallocated_out_keeps_padded_rows():
    batch = _batch([3, 10], [2, 5], seed=8)
    out = torch.full_like(batch.q, 7.0)
    scale = 0.25
    args = (batch.q, batch.k_cache, batch.v_cache, *batch.metadata(), batch.page_size, scale)
    result = attention.paged_attention(*args, out=out)
    assert result is out
    assert torch.all(out[7:] == 7.0)
    want = reference.paged_attention(*[_f64(a) for a in args[:3]], *args[3:])
    torch.testing.assert_close(out[:7].double(), want[:7], atol=2e-4, rtol=2e-4)


def test_launches_by_query_length_fill_one_output():
    """A mixed extend as two launches in different tiles, each over the requests whose
    query_len lies in its range (what ``launch_plan`` makes of a prefill graph holding short
    and long prompts): together they write every row once, as one launch would."""
    batch = _batch([0, 6, 0, 30], [3, 9, 1, 14], sentinels=2, seed=9)
    scale = batch.q.shape[-1] ** -0.5
    args = (batch.q, batch.k_cache, batch.v_cache, *batch.metadata(), batch.page_size, scale)
    short = attention_tiles.choose_tiles(torch.device("cpu"), batch.q.shape[0], 6, 4, 2, 16, None)
    long = dataclasses.replace(short, block_q=short.block_q * 2, block_n=short.block_n * 2)
    out = attention.paged_attention(*args, tiles=short, query_len_range=(0, 3))
    only_short = out.clone()
    attention.paged_attention(*args, tiles=long, query_len_range=(4, 1 << 30), out=out)
    want = reference.paged_attention(*[_f64(a) for a in args[:3]], *args[3:])
    torch.testing.assert_close(out[:27].double(), want[:27], atol=2e-4, rtol=2e-4)
    assert torch.all(out[27:] == 0), "padded rows must not be written"
    # the first launch left the longer requests' rows (tokens 3-11 and 13-26) alone
    assert torch.all(only_short[3:12] == 0) and torch.all(only_short[13:27] == 0)
    assert torch.all(only_short[:3] == out[:3]) and torch.all(only_short[12] == out[12])


def test_only_sentinels_is_a_no_op():
    batch = _batch([], [], sentinels=4, pad=5)
    out = attention.paged_attention(
        batch.q, batch.k_cache, batch.v_cache, *batch.metadata(), batch.page_size, 1.0,
        max_query_len=1, num_splits=2,
    )  # fmt: skip
    assert torch.all(out == 0)


def test_tiles_depend_only_on_static_sizes():
    cpu = torch.device("cpu")
    decode = attention_tiles.choose_tiles(cpu, 64, 64, 32, 8, 128, max_query_len=1)
    extend = attention_tiles.choose_tiles(cpu, 64, 4, 32, 8, 128, max_query_len=None)
    assert decode.per_request and not extend.per_request
    assert decode.block_q * decode.group_pad >= 16 and extend.block_q * extend.group_pad >= 16
    with pytest.raises(ValueError, match="power of two"):
        attention_tiles.choose_tiles(cpu, 8, 8, 4, 2, 16, max_query_len=1, num_splits=3)


# -- fused elementwise kernels ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_and_add_rmsnorm(dtype):
    gen = torch.Generator().manual_seed(10)
    x = torch.randn(5, 48, generator=gen).to(dtype)  # hidden not a power of two
    residual = torch.randn(5, 48, generator=gen).to(dtype)
    weight = torch.randn(48, generator=gen).to(dtype)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(
        fused.rmsnorm(x, weight, 1e-6), reference.rmsnorm(x, weight, 1e-6), atol=tol, rtol=tol
    )
    res_kernel, res_ref = residual.clone(), residual.clone()
    normed, returned = fused.add_rmsnorm(x, res_kernel, weight, 1e-6)
    want, _ = reference.add_rmsnorm(x, res_ref, weight, 1e-6)
    assert returned is res_kernel
    # residual updated in place; the interpreter truncates fp32 -> bf16 where the GPU rounds to
    # nearest, hence one bf16 ulp of slack here (tests/gpu check it exactly)
    ulp = 2.0**-7 if dtype == torch.bfloat16 else 0.0
    torch.testing.assert_close(res_kernel, res_ref, atol=0, rtol=ulp)
    torch.testing.assert_close(normed, want, atol=tol, rtol=tol)


def test_silu_and_mul():
    x = torch.randn(3, 2, 80, generator=torch.Generator().manual_seed(11))
    out = fused.silu_and_mul(x)
    assert out.shape == (3, 2, 40)
    torch.testing.assert_close(out, reference.silu_and_mul(x), atol=1e-6, rtol=1e-5)


def _rope_table(head_dim: int, max_positions: int) -> torch.Tensor:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    freqs = torch.outer(torch.arange(max_positions, dtype=torch.float64), inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).float()


def _hf_rope(x: torch.Tensor, positions: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Hugging Face's apply_rotary_pos_emb: x * cos + rotate_half(x) * sin, float64."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    emb = torch.outer(positions.double(), inv_freq).repeat(1, 2)[:, None, :]
    half = head_dim // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * emb.cos() + rotated * emb.sin()


@pytest.mark.parametrize("qk_norm", [False, True])
def test_rope_store_kv(qk_norm):
    gen = torch.Generator().manual_seed(12)
    rows, q_heads, kv_heads, head_dim = 7, 6, 2, 32
    q = torch.randn(rows, q_heads, head_dim, generator=gen)
    k = torch.randn(rows, kv_heads, head_dim, generator=gen)
    v = torch.randn(rows, kv_heads, head_dim, generator=gen)
    positions = torch.tensor([0, 5, 6, 31, 2, 0, 0])
    slots = torch.tensor([4, 9, 10, 0, 17, -1, -1])  # the last two rows are padding
    q_norm = torch.randn(head_dim, generator=gen) if qk_norm else None
    k_norm = torch.randn(head_dim, generator=gen) if qk_norm else None
    table = _rope_table(head_dim, 40)
    caches = [torch.full((20, kv_heads, head_dim), float("nan")) for _ in range(4)]
    q_kernel, k_kernel, q_ref, k_ref = q.clone(), k.clone(), q.clone(), k.clone()
    fused.rope_store_kv(q_kernel, k_kernel, v, positions, table, caches[0], caches[1], slots,
                        q_norm_weight=q_norm, k_norm_weight=k_norm)  # fmt: skip
    reference.rope_store_kv(q_ref, k_ref, v, positions, table, caches[2], caches[3], slots,
                            q_norm_weight=q_norm, k_norm_weight=k_norm)  # fmt: skip
    for got, want in [(q_kernel, q_ref), (k_kernel, k_ref)]:
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for got, want in [(caches[0], caches[2]), (caches[1], caches[3])]:
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, equal_nan=True)
    written = slots[slots >= 0]
    untouched = torch.ones(20, dtype=torch.bool)
    untouched[written] = False
    assert torch.all(caches[0][untouched].isnan()), "slot -1 rows must not be written"
    torch.testing.assert_close(caches[1][written], v[:5])
    if not qk_norm:  # the plain case against Hugging Face's formula directly
        torch.testing.assert_close(q_kernel.double(), _hf_rope(q.double(), positions, head_dim),
                                   atol=1e-5, rtol=1e-5)  # fmt: skip


@pytest.mark.parametrize("impl", [fused, reference])
def test_rope_store_kv_skips_rows_past_num_tokens_and_zeroes_them_in_the_output(impl):
    gen = torch.Generator().manual_seed(13)
    q = torch.randn(4, 3, 16, generator=gen)  # 3 heads: a padded power-of-two block
    k = torch.randn(4, 1, 16, generator=gen)
    v = torch.randn(4, 1, 16, generator=gen)
    positions = torch.tensor([1, 2, 10_000, -5])  # garbage positions in padded rows
    slots = torch.tensor([0, 1, 2, 3])
    k_cache = torch.zeros(4, 1, 16)
    v_cache = torch.zeros(4, 1, 16)
    out = torch.full_like(q, float("nan"))  # the attention output, uninitialised
    q_before = q.clone()
    impl.rope_store_kv(q, k, v, positions, _rope_table(16, 8), k_cache, v_cache, slots,
                       num_tokens=torch.tensor([2], dtype=torch.int32),
                       zero_padding=out)  # fmt: skip
    assert torch.equal(q[2:], q_before[2:])
    assert torch.all(k_cache[2:] == 0) and torch.all(v_cache[2:] == 0)
    assert not torch.equal(q[:2], q_before[:2])
    # padded rows zeroed, the token rows left to attention
    assert torch.all(out[2:] == 0) and torch.all(out[:2].isnan())


def test_rope_store_kv_refuses_a_zero_padding_unlike_q():
    q, k = torch.randn(2, 2, 16), torch.randn(2, 1, 16)
    cache = torch.zeros(4, 1, 16)
    with pytest.raises(ValueError, match="zero_padding must be shaped like q"):
        fused.rope_store_kv(q, k, k, torch.tensor([0, 1]), _rope_table(16, 8), cache, cache,
                            torch.tensor([0, 1]), zero_padding=torch.zeros(2, 16, 2))  # fmt: skip


def _one_row_rope(context, q_heads, kv_heads, head_dim, qk_norm, dtype, seed, **attend):
    """A one-row decode whose q/k/v are a GEMV's raw output: ``_rows_rope`` of one request
    without sentinels, padding or a live token count, its new key's slot as an int."""
    batch, rope, caches_ref, slots, want = _rows_rope(
        [context], [1], q_heads, kv_heads, head_dim, dtype, seed, qk_norm=qk_norm, sentinels=0,
        pad=0, live_count=False, **attend,
    )  # fmt: skip
    return batch, rope, caches_ref, int(slots[0]), want


# float16, not bfloat16: the interpreter multiplies bfloat16 dot operands as their raw bits
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    ("context", "q_heads", "kv_heads", "head_dim", "num_splits", "qk_norm"),
    [(0, 4, 2, 16, 1, True), (13, 6, 2, 32, 4, True), (37, 4, 4, 16, 8, False),
     (64, 8, 2, 16, 32, True), (16, 4, 2, 16, 2, True), (15, 4, 2, 16, 1, True),
     (37, 4, 2, 16, 1, True)],
)  # fmt: skip
def test_one_row_decode_rotates_and_stores_in_the_attention_kernel(
    context, q_heads, kv_heads, head_dim, num_splits, qk_norm, dtype
):
    """paged_attention(rope=...) on a one-row decode equals rope_store_kv then attention: the
    same output, the new key and value in the cache (stored before the slice holding them
    reads them back: their slot holds NaN before the launch), q and k left as the GEMV wrote
    them. Contexts from the first token alone to several key blocks per slice, the new key
    first in its key block (16: a slice of it alone), last in it (15) and in a slice's third
    block (37, one slice); group sizes 2, 3 (padded) and 1."""
    batch, rope, caches_ref, slot, want = _one_row_rope(
        context, q_heads, kv_heads, head_dim, qk_norm, dtype, seed=context + num_splits
    )
    q_before, k_before = batch.q.clone(), rope.k.clone()
    got = attention.paged_attention(
        batch.q, batch.k_cache, batch.v_cache, *batch.metadata(), batch.page_size,
        head_dim**-0.5, max_query_len=1, num_splits=num_splits, rope=rope,
    )  # fmt: skip
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)
    torch.testing.assert_close(batch.k_cache[slot].double(), caches_ref[0][slot], atol=tol,
                               rtol=tol)  # fmt: skip
    assert torch.equal(batch.v_cache[slot], rope.v[0])
    assert torch.equal(batch.q, q_before) and torch.equal(rope.k, k_before)


def _rows_rope(
    contexts, queries, q_heads, kv_heads, head_dim, dtype, seed, *, qk_norm=True, sentinels=2,
    pad=3, live_count=True, **attend,
):  # fmt: skip
    """A graph-shaped batch of requests whose q/k/v are a projection's raw output (a decode of
    many rows, or a verify of k + 1 tokens each; sentinel slots, padded rows): the batch, the
    rope inputs (``live_count``: with the live token count), the float64 caches and answer of
    rope_store_kv + attention (the unfused path; ``attend``: the attention's window, sinks,
    softcap), the new keys' slots, which hold NaN (read before stored, the output turns NaN)."""
    gen = torch.Generator().manual_seed(seed)
    batch = _batch(contexts, queries, q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim,
                   dtype=dtype, sentinels=sentinels, pad=pad, seed=seed)  # fmt: skip
    n = batch.q.shape[0]
    k = torch.randn(n, kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(n, kv_heads, head_dim, generator=gen).to(dtype)
    norms = [(1 + 0.3 * torch.randn(head_dim, generator=gen)).to(dtype) if qk_norm else None
             for _ in range(2)]  # fmt: skip
    table = _rope_table(head_dim, max(c + q for c, q in zip(contexts, queries)) + 1)
    num_tokens = batch.num_tokens if live_count else None
    rope = attention.RopeStore(k, v, batch.positions, table, batch.slot_mapping, *norms,
                               eps=1e-6, num_tokens=num_tokens)  # fmt: skip
    slots = batch.slot_mapping[batch.slot_mapping >= 0]
    q_ref, k_ref = _f64(batch.q.clone()), _f64(k.clone())
    caches_ref = [_f64(batch.k_cache.clone()), _f64(batch.v_cache.clone())]
    reference.rope_store_kv(q_ref, k_ref, _f64(v), batch.positions, table.double(), *caches_ref,
                            batch.slot_mapping, q_norm_weight=_f64(norms[0]),
                            k_norm_weight=_f64(norms[1]), eps=1e-6,
                            num_tokens=num_tokens)  # fmt: skip
    want = reference.paged_attention(q_ref, *caches_ref, *batch.metadata(), batch.page_size,
                                     head_dim**-0.5, max_query_len=max(queries),
                                     **attend)  # fmt: skip
    batch.k_cache[slots] = float("nan")
    batch.v_cache[slots] = float("nan")
    return batch, rope, caches_ref, slots, want


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    ("contexts", "q_heads", "kv_heads", "num_splits"),
    [([7, 21, 9, 2], 8, 2, 4), ([15, 0, 30], 4, 2, 4), ([14, 3], 6, 2, 8), ([40], 4, 4, 1),
     ([16, 31], 4, 2, 32)],
)  # fmt: skip
def test_decode_rows_rotate_and_store_in_the_attention_kernel(
    contexts, q_heads, kv_heads, num_splits, dtype
):
    """paged_attention(rope=...) over a decode of several requests (sentinel slots and padded
    rows as in a graph) equals rope_store_kv then attention: the same output, every new key
    and value in the cache (stored before any slice reads it: their slots hold NaN before the
    launch), the padded rows zeroed, q and k left as written. New keys first in a block (15 +
    1, 16 at 16-key blocks) or alone in their slice, an empty context, group sizes 4, 2, 3
    (padded) and 1."""
    batch, rope, caches_ref, slots, want = _rows_rope(
        contexts, [1] * len(contexts), q_heads, kv_heads, 16, dtype,
        seed=sum(contexts) + num_splits,
    )  # fmt: skip
    q_before, k_before = batch.q.clone(), rope.k.clone()
    out = torch.full_like(batch.q, float("nan"))  # a graph's buffer: padded rows not zero
    got = attention.paged_attention(
        batch.q, batch.k_cache, batch.v_cache, *batch.metadata(), batch.page_size, 16**-0.5,
        max_query_len=1, num_splits=num_splits, rope=rope, out=out,
    )  # fmt: skip
    tol = TOLERANCE[dtype]
    live = int(batch.num_tokens)
    torch.testing.assert_close(got[:live].double(), want[:live], atol=tol, rtol=tol)
    assert not got[live:].any()
    torch.testing.assert_close(batch.k_cache[slots].double(), caches_ref[0][slots], atol=tol,
                               rtol=tol)  # fmt: skip
    assert torch.equal(batch.v_cache[slots], rope.v[:live])
    assert torch.equal(batch.q, q_before) and torch.equal(rope.k, k_before)


def test_decode_rows_with_rope_under_window_sinks_and_softcap():
    """A decode of several rows rotating and storing its keys under a sliding window shorter
    than its contexts, sinks and a softcap (gpt-oss's layers)."""
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(2))
    window, softcap = 6, 3.0
    batch, rope, _, _, want = _rows_rope(
        [13, 25], [1, 1], 4, 2, 16, torch.float32, 6, sliding_window=window, sinks=_f64(sinks),
        softcap=softcap,
    )  # fmt: skip
    got = attention.paged_attention(
        batch.q, batch.k_cache, batch.v_cache, *batch.metadata(), batch.page_size, 16**-0.5,
        sliding_window=window, sinks=sinks, softcap=softcap, max_query_len=1, num_splits=4,
        rope=rope,
    )  # fmt: skip
    live = int(batch.num_tokens)
    torch.testing.assert_close(got[:live].double(), want[:live], atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize(
    "tiles", [None, attention_tiles.AttentionTiles(2, 2, 16, 2, 1, True, 1, 1)]
)
def test_rope_in_a_verify_takes_rope_store_kv(tiles):
    """A verify given ``rope`` (queries of several tokens, in the tiles the kernel picks or in
    forced tiles of fewer rows than a request) rotates and stores through rope_store_kv first,
    zeroing the padded rows as it does."""
    batch, rope, caches_ref, slots, want = _rows_rope([9, 4], [5, 3], 4, 2, 16, torch.float32, 7)
    out = torch.full_like(batch.q, float("nan"))
    got = attention.paged_attention(
        batch.q, batch.k_cache, batch.v_cache, *batch.metadata(), batch.page_size, 0.25,
        max_query_len=5, tiles=tiles, rope=rope, out=out,
    )  # fmt: skip
    live = int(batch.num_tokens)
    torch.testing.assert_close(got[:live].double(), want[:live], atol=2e-4, rtol=2e-4)
    assert not got[live:].any()
    torch.testing.assert_close(batch.k_cache[slots].double(), caches_ref[0][slots])


@pytest.mark.parametrize("num_splits", [1, 4])
def test_one_row_decode_with_rope_under_window_sinks_and_softcap(num_splits):
    """The one-row decode rotating and storing its key under a sliding window, sinks and a
    softcap (gpt-oss's layers): the new key is inside the window and capped like the cached
    ones, the window's start falls inside a key block, and the sinks join the denominator."""
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(1))
    window, softcap = 7, 3.0
    batch, rope, _, _, want = _one_row_rope(
        37, 4, 2, 16, False, torch.float32, 5, sliding_window=window, sinks=_f64(sinks),
        softcap=softcap,
    )  # fmt: skip
    got = attention.paged_attention(
        batch.q, batch.k_cache, batch.v_cache, *batch.metadata(), batch.page_size, 16**-0.5,
        sliding_window=window, sinks=sinks, softcap=softcap, max_query_len=1,
        num_splits=num_splits, rope=rope,
    )  # fmt: skip
    torch.testing.assert_close(got.double(), want, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize(
    ("context", "num_splits", "min_split_blocks", "min_slices", "window"),
    [(0, 4, 1, 1, 0), (37, 4, 1, 1, 0), (64, 2, 2, 1, 0), (100, 8, 2, 4, 0), (37, 4, 1, 1, 7),
     (100, 2, 4, 1, 21)],
)  # fmt: skip
def test_one_range_gives_the_three_loops_output(
    context, num_splits, min_split_blocks, min_slices, window
):
    """AttentionTiles.one_range (a slice's key blocks in one masked loop, the one-row decode's
    configuration on a GPU) gives the three-loop kernel's output bit for bit: the same blocks
    in the same order, and a mask that keeps a key changes nothing. With the new key rotated
    and stored in the launch, page ids loaded a block ahead, several blocks a slice, slices
    kept short (min_slices), and a window (gpt-oss: sinks, softcap) starting inside a block."""
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(2)) if window else None
    attend = dict(sliding_window=window, sinks=sinks, softcap=3.0 if window else 0.0)
    batch, rope, _, slot, want = _one_row_rope(
        context, 4, 2, 16, True, torch.float32, 11, sliding_window=window, sinks=_f64(sinks),
        softcap=attend["softcap"],
    )  # fmt: skip
    tiles = dataclasses.replace(
        attention_tiles.choose_tiles(batch.q.device, 1, 1, 4, 2, 16, 1), num_splits=num_splits,
        min_split_blocks=min_split_blocks, min_slices=min_slices, prefetch_pages=True,
    )  # fmt: skip
    outs = []
    for one in (False, True):
        outs.append(attention.paged_attention(
            batch.q, batch.k_cache, batch.v_cache, *batch.metadata(), batch.page_size,
            16**-0.5, max_query_len=1, rope=rope, tiles=dataclasses.replace(tiles, one_range=one),
            **attend,
        ))  # fmt: skip
    torch.testing.assert_close(outs[1].double(), want, atol=2e-4, rtol=2e-4)
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(batch.v_cache[slot], rope.v[0])


def test_rope_in_attention_outside_a_one_row_tile_takes_rope_store_kv():
    """Launches other than the one-row decode's (forced flat tiles, a one-token extend) rotate
    and store through rope_store_kv first, with the same result; k/v rows unlike q's are
    refused."""
    batch, rope, caches_ref, slot, want = _one_row_rope(9, 4, 2, 16, True, torch.float32, 3)
    flat = attention_tiles.AttentionTiles(1, 2, 16, 1, 1, False, 1, 1)
    got = attention.paged_attention(
        batch.q, batch.k_cache, batch.v_cache, *batch.metadata(), batch.page_size, 0.25,
        max_query_len=1, tiles=flat, rope=rope,
    )  # fmt: skip
    torch.testing.assert_close(got.double(), want, atol=2e-4, rtol=2e-4)
    torch.testing.assert_close(batch.k_cache[slot].double(), caches_ref[0][slot])
    batch, rope, caches_ref, slot, want = _one_row_rope(9, 4, 2, 16, True, torch.float32, 3)
    got = attention.paged_attention(  # a one-token extend: no max_query_len
        batch.q, batch.k_cache, batch.v_cache, *batch.metadata(), batch.page_size, 0.25,
        rope=rope,
    )  # fmt: skip
    torch.testing.assert_close(got.double(), want, atol=2e-4, rtol=2e-4)
    with pytest.raises(ValueError, match="a row per row of q"):
        attention.paged_attention(
            batch.q.expand(2, -1, -1), batch.k_cache, batch.v_cache, *batch.metadata(),
            batch.page_size, 0.25, max_query_len=1, rope=rope,
        )  # fmt: skip


def test_rope_in_attention_refuses_bad_rope_inputs():
    """A cos/sin table of another width, or k/v not contiguous in head_dim, is refused before
    anything is written (the cache still holds the NaN the new key's slot was poisoned with)."""
    batch, rope, _, slot, _ = _one_row_rope(9, 4, 2, 16, True, torch.float32, 3)
    bad = [
        (dataclasses.replace(rope, cos_sin_cache=rope.cos_sin_cache[:, :8]), "head_dim 16"),
        (dataclasses.replace(rope, k=rope.k.transpose(1, 2).contiguous().transpose(1, 2)),
         "contiguous"),
    ]  # fmt: skip
    for bad_rope, match in bad:
        with pytest.raises(ValueError, match=match):
            attention.paged_attention(
                batch.q, batch.k_cache, batch.v_cache, *batch.metadata(), batch.page_size, 0.25,
                max_query_len=1, rope=bad_rope,
            )  # fmt: skip
    assert torch.isnan(batch.k_cache[slot]).all()


@pytest.mark.parametrize("seed", range(6))
def test_random_batches(seed):
    """Random lengths, head layouts and features; decode/verify/extend chosen by the lengths."""
    gen = torch.Generator().manual_seed(100 + seed)

    def pick(options):
        return options[int(torch.randint(len(options), (1,), generator=gen))]

    kv_heads, group = pick([1, 2]), pick([1, 2, 3, 4])
    num_requests = int(torch.randint(1, 6, (1,), generator=gen))
    max_query = pick([1, 3, 16])
    contexts = torch.randint(0, 40, (num_requests,), generator=gen).tolist()
    queries = torch.randint(1, max_query + 1, (num_requests,), generator=gen).tolist()
    batch = make_paged_batch(
        contexts, queries, num_q_heads=kv_heads * group, num_kv_heads=kv_heads,
        head_dim=pick([16, 32]), page_size=pick([1, 4, 5, 16]),
        num_sentinels=pick([0, 2]), padded_tokens=sum(queries) + pick([0, 4]), generator=gen,
    )  # fmt: skip
    kwargs = {
        "sliding_window": pick([0, 0, 4, 25]),
        "softcap": pick([0.0, 0.0, 4.0]),
        "num_splits": pick([1, 2, 8]),
        "max_query_len": pick([None, max_query]),
    }
    if pick([False, True]):
        kwargs["sinks"] = torch.randn(kv_heads * group, generator=gen)
    _check_attention(batch, torch.float32, **kwargs)


# -- the whole model: Triton attention backend against the torch-native one ------------------


def test_model_with_triton_attention_matches_torch_native(tiny_model_dir):
    """A tiny Qwen3 through the engine (chunked prefill, mixed batch, decode) gives the same
    greedy tokens with the Triton backend (interpreted here) as with torch-native attention."""
    from nanograph import LLM, SamplingParams

    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 256, (k,), generator=g).tolist() for k in (5, 19, 11)]
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    outs = {}
    for backend in ("torch_native", "triton"):
        llm = LLM(str(tiny_model_dir("qwen3")), attention_backend=backend, page_size=4,
                  chunked_prefill_size=8, kv_cache_bytes=2**20, progress=False)  # fmt: skip
        outs[backend] = [o.token_ids for o in llm.generate(prompts, params)]
    assert outs["triton"] == outs["torch_native"]


@pytest.mark.parametrize("silu_mul", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemv_matches_a_float64_matmul(dtype, silu_mul):
    """Odd N and K (masked edges) over several K blocks; with ``silu_mul`` the row multiplied is
    the activation ``silu_and_mul`` writes (rounded to the dtype), as the MLP's down projection."""
    g = torch.Generator().manual_seed(int(silu_mul))
    x = torch.randn(1, 140 if silu_mul else 70, generator=g).to(dtype)
    w = torch.randn(37, 70, generator=g).to(dtype)
    tiles = gemv.GemvTiles(block_n=8, block_k=16, num_warps=1, num_stages=1)
    out = gemv.gemv(x, w, silu_mul=silu_mul, tiles=tiles)
    row = reference.silu_and_mul(x) if silu_mul else x
    expected = row.double() @ w.double().T
    assert out.dtype == dtype and out.shape == (1, 37)
    torch.testing.assert_close(
        out.double(), expected, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype] * 8
    )


@pytest.mark.parametrize("split_k", [1, 2, 3])
@pytest.mark.parametrize("silu_out", [False, True])
@pytest.mark.parametrize("m", [2, 5, 8, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_gemm_rows_matches_a_float64_matmul(dtype, m, silu_out, split_k):
    """2 to 16 rows (16: every padded MMA row live), odd N and K (masked edges) over several K
    blocks; with ``silu_out`` the gate and up halves are rounded to the dtype before
    ``silu_and_mul``, as the plain product followed by the activation kernel writes them.
    ``split_k``: the 5 K blocks over 2 programs (3 + 2 blocks) or 3 (2 + 2 + 1), the last to
    finish summing the partials; launched twice, so the second launch finds its counters
    zeroed again. (bf16: the interpreter's bf16 ``tl.dot`` is not exact; the device tests
    cover it.)"""
    g = torch.Generator().manual_seed(m)
    x = torch.randn(m, 70, generator=g).to(dtype)
    w = (torch.randn(74 if silu_out else 37, 70, generator=g) / 8).to(dtype)
    tiles = rows.RowsTiles(16, 16, 1, 1, split_k=split_k)
    expected = (x.double() @ w.double().T).to(dtype)
    if silu_out:
        expected = reference.silu_and_mul(expected)
    for _ in range(2):
        out = rows.gemm_rows(x, w, silu_out=silu_out, tiles=tiles)
        assert out.dtype == dtype and out.shape == (m, 37)
        torch.testing.assert_close(out.double(), expected.double(), rtol=TOLERANCE[dtype],
                                   atol=TOLERANCE[dtype] * 8)  # fmt: skip
        assert int(split_counters(x.device, 0).abs().sum()) == 0


@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("silu_out", [False, True])
@pytest.mark.parametrize("m", [2, 5])
def test_gemm_rows_adds_into_a_residual_and_takes_the_next_rmsnorm_in(m, silu_out, split_k):
    """``gemm_rows_normed``: the product rounded, added into the stream in place; the stream
    times the next norm's weight, and its rows' sums of squares in parts (one per program on
    the stream's 70 columns: 5 of 16). ``norm``: the next product scales each row by the
    stream's 1/rms: an RMSNorm's output multiplied, within rounding."""
    dtype = torch.float32
    g = torch.Generator().manual_seed(10 + m)
    stream = (torch.randn(m, 70, generator=g) * 3).to(dtype)
    x = torch.randn(m, 40, generator=g).to(dtype)
    w_in = (torch.randn(70, 40, generator=g) / 4).to(dtype)
    norm_weight = 1 + 0.1 * torch.randn(70, generator=g)
    w = (torch.randn(74 if silu_out else 37, 70, generator=g) / 8).to(dtype)
    tiles = rows.RowsTiles(16, 16, 1, 1, split_k=split_k)
    want = (stream.double() + (x.double() @ w_in.double().T).to(dtype)).to(dtype)
    before = stream
    normed = rows.gemm_rows_normed(x, w_in, stream, (norm_weight, 1e-5), tiles=tiles)
    assert stream is before
    torch.testing.assert_close(stream.double(), want.double(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(normed.scaled, (want * norm_weight).to(dtype), rtol=1e-6, atol=1e-6)
    assert normed.sumsq.shape == (5, rows.MAX_ROWS) and normed.eps == 1e-5
    torch.testing.assert_close(normed.sumsq.sum(0)[:m].double(), want.double().pow(2).sum(1),
                               rtol=1e-5, atol=1e-5)  # fmt: skip
    inv = torch.rsqrt(want.double().pow(2).mean(dim=1, keepdim=True) + 1e-5)
    expected = ((normed.scaled.double() @ w.double().T) * inv).to(dtype)
    if silu_out:
        expected = reference.silu_and_mul(expected)
    out = rows.gemm_rows(normed.scaled, w, silu_out=silu_out, norm=normed, tiles=tiles)
    torch.testing.assert_close(out.double(), expected.double(), rtol=1e-5, atol=1e-5)
    assert int(split_counters(x.device, 0).abs().sum()) == 0
    with pytest.raises(ValueError, match="x is norm.scaled"):
        rows.gemm_rows(normed.scaled.clone(), w, norm=normed, tiles=tiles)
    with pytest.raises(ValueError, match="contiguous \\[70\\]"):
        rows.gemm_rows_normed(x, w_in, stream, (norm_weight[::2], 1e-5), tiles=tiles)


def test_gemm_rows_writes_into_out_and_refuses_what_it_cannot_take():
    x, w = torch.randn(3, 32), torch.randn(20, 32)
    out = torch.full((3, 20), float("nan"))
    assert rows.gemm_rows(x, w, out=out) is out
    torch.testing.assert_close(out, x @ w.T, rtol=2e-4, atol=2e-4)
    with pytest.raises(ValueError, match="2 to 16 rows, got 1"):
        rows.gemm_rows(torch.randn(1, 32), w)
    with pytest.raises(ValueError, match="2 to 16 rows, got 17"):
        rows.gemm_rows(torch.randn(17, 32), w)
    with pytest.raises(ValueError, match="needs x"):
        rows.gemm_rows(x, torch.randn(20, 33))
    with pytest.raises(ValueError, match="even number"):
        rows.gemm_rows(x, torch.randn(21, 32), silu_out=True)
    with pytest.raises(ValueError, match="contiguous in K"):
        rows.gemm_rows(torch.randn(32, 3).T, w)
    with pytest.raises(ValueError, match="float16"):
        rows.gemm_rows(x.half(), w)
    with pytest.raises(ValueError, match="out must be"):
        rows.gemm_rows(x, w, out=torch.empty(3, 10))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gemv_float32_out_is_the_product_rounded_then_cast(dtype):
    """A float32 ``out`` (the LM head's logits) holds the product rounded to x's dtype, bit for
    bit what the product in x's dtype then ``.float()`` gives."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(1, 70, generator=g).to(dtype)
    w = torch.randn(37, 70, generator=g).to(dtype)
    tiles = gemv.GemvTiles(block_n=8, block_k=16, num_warps=1, num_stages=1)
    out = torch.full((1, 37), float("nan"))
    assert gemv.gemv(x, w, out=out, tiles=tiles) is out
    assert torch.equal(out, gemv.gemv(x, w, tiles=tiles).float())


def test_gemv_refuses_what_it_cannot_take():
    with pytest.raises(ValueError, match="one row, got 2"):
        gemv.gemv(torch.randn(2, 8), torch.randn(4, 8))
    with pytest.raises(ValueError, match="needs K"):
        gemv.gemv(torch.randn(1, 8), torch.randn(4, 9))
    with pytest.raises(ValueError, match="needs 2K"):
        gemv.gemv(torch.randn(1, 8), torch.randn(4, 8), silu_mul=True)
    with pytest.raises(ValueError, match="out must be"):
        gemv.gemv(torch.randn(1, 8), torch.randn(4, 8), out=torch.empty(1, 5))
    with pytest.raises(ValueError, match="out must be"):
        gemv.gemv(torch.randn(1, 8).half(), torch.randn(4, 8).half(),
                  out=torch.empty(1, 4, dtype=torch.bfloat16))  # fmt: skip
    with pytest.raises(ValueError, match="out must be"):
        gemv.gemv(torch.randn(1, 8).half(), torch.randn(8, 8).half(), silu_out=True,
                  out=torch.empty(1, 4))  # fmt: skip


def test_an_eager_launch_sizes_the_graph_lane_outside_any_capture():
    # a graph-lane buffer first made inside a capture would be zero-filled only when that
    # graph replays; eager launches (start-up's warm-up) make it first, zeroed at once
    from nanograph.kernels import counters

    device = torch.device("cpu")
    saved = dict(counters._COUNTERS)
    counters._COUNTERS.clear()
    try:
        mine = counters.split_counters(device, 3000)
        graph = counters._COUNTERS[(device, "graph")][-1]
        assert mine is not graph and mine.numel() == graph.numel() == 4096
        assert int(graph.abs().sum()) == 0
    finally:
        counters._COUNTERS.clear()
        counters._COUNTERS.update(saved)


@pytest.mark.parametrize("width, block", [(1, 16), (13, 16), (16, 16), (100, 16), (257, 32)])
def test_argmax_matches_torch(width, block):
    """Rows over one part or several (the last count-in picks), ties (the first index wins, also
    across parts), a row of -inf (index 0), NaN (as +inf, as torch's), float32 and bf16;
    launched twice so the second launch finds its counters zeroed again."""
    argmax = _import_interpreted("nanograph.kernels.argmax")
    g = torch.Generator().manual_seed(width)
    x = torch.randn(6, width, generator=g)
    x[1] = torch.randint(0, 3, (width,), generator=g).float()  # many ties
    x[2] = float("-inf")
    x[3, width // 2 :] = x[3].max() + 1  # the maximum in several parts at once
    x[4, width - 1] = float("nan")
    for dtype in (torch.float32, torch.bfloat16):
        rows = x.to(dtype)
        for _ in range(2):
            assert argmax.argmax(rows, block=block).tolist() == rows.argmax(dim=-1).tolist()
            assert int(split_counters(x.device, 0).abs().sum()) == 0
    assert argmax.argmax(x[:0], block=block).shape == (0,)
    with pytest.raises(ValueError, match="contiguous in width"):
        argmax.argmax(torch.randn(4, 8).T)
    drafts = torch.full((3, 6), -1, dtype=torch.long)  # a draft loop's rows, written in place
    got = argmax.argmax(x, out=drafts[1], block=block)
    assert got.data_ptr() == drafts[1].data_ptr()
    assert drafts[1].tolist() == x.argmax(dim=-1).tolist() and int(drafts[0].max()) == -1
    for bad in (drafts[:, 0], drafts[1, :5], drafts[1].int()):
        with pytest.raises(ValueError, match="out needs"):
            argmax.argmax(x, out=bad, block=block)


@pytest.mark.parametrize("num_slots, page_size", [(1, 16), (5, 4), (13, 1), (64, 16), (130, 8)])
def test_draft_inputs_advance_equals_the_torch_ops(num_slots, page_size):
    """One launch moves a draft loop's inputs on as the runner's torch ops do: live slots one
    position on (across page boundaries: positions just before one), sentinel slots (length 0)
    kept, slot -1; every slot's token copied. Three steps in a row; a page table wider than
    the slots' rows and with more rows than slots; past 128 slots, more than one part."""
    draft_inputs = _import_interpreted("nanograph.kernels.draft_inputs")
    from nanograph.runners.decode_runner import advance_inputs

    g = torch.Generator().manual_seed(num_slots)
    max_pages = 12
    seq_lens = torch.randint(1, page_size * 8, (num_slots,), generator=g, dtype=torch.int32)
    seq_lens[2::3] = 0  # sentinel slots
    seq_lens[0] = page_size  # its next position starts a page
    positions = (seq_lens.long() - 1).clamp(min=0)
    table = torch.randint(1, 500, (num_slots + 3, max_pages), generator=g, dtype=torch.int32)
    state = {
        "ids": torch.randint(0, 100, (num_slots,), generator=g),
        "positions": positions,
        "seq_lens": seq_lens.clone(),
        "slots": torch.zeros(num_slots, dtype=torch.long),
    }
    mine = {k: v.clone() for k, v in state.items()}
    rows = torch.arange(num_slots)
    for _ in range(3):
        tokens = torch.randint(0, 100, (num_slots,), generator=g)
        draft_inputs.advance_draft_inputs(tokens, *mine.values(), table, page_size)
        advance_inputs(tokens, *state.values(), table[:num_slots], rows, page_size)
        for name in state:
            assert mine[name].tolist() == state[name].tolist(), name
    live = seq_lens > 0
    assert (mine["slots"][~live] == -1).all() and (mine["slots"][live] >= 0).all()
    assert mine["seq_lens"][live].tolist() == (seq_lens[live] + 3).tolist()


def test_draft_inputs_advance_refuses_bad_buffers():
    draft_inputs = _import_interpreted("nanograph.kernels.draft_inputs")
    ids, positions, slots = (torch.zeros(4, dtype=torch.long) for _ in range(3))
    seq_lens, table = torch.ones(4, dtype=torch.int32), torch.zeros(4, 8, dtype=torch.int32)
    with pytest.raises(ValueError, match="positions needs"):
        draft_inputs.advance_draft_inputs(ids, ids, positions[:3], seq_lens, slots, table, 16)
    with pytest.raises(ValueError, match="page_table needs"):
        draft_inputs.advance_draft_inputs(ids, ids, positions, seq_lens, slots, table[:3], 16)
    with pytest.raises(ValueError, match="page_table needs"):
        draft_inputs.advance_draft_inputs(ids, ids, positions, seq_lens, slots, table.T, 16)
