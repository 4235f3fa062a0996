"""Host (Python) time of one eager ``paged_attention`` call through the Hopper route: a 1 x N
prefill in a 16-slot batch, qwen3-0.6b heads, both kernels' launches mocked (LaunchCache keys
and all, no launcher), CPU tensors posing as CUDA ones. Stop 54, on the CPU machine:

    cp docs/wip/attention_host_time.py /tmp
    PYTHONPATH=$PWD python3 /tmp/attention_host_time.py 256 [live] [prof]

``live`` passes the prompt's own length as ``query_len_range`` (what TritonAttention does for
an eager call since stop 55); ``prof`` prints a cProfile of 2000 calls. Stop 54 (minimum of
five runs): 53 us before the three host-cost patches stop 55 landed (004f0ca, d7b3b16,
9b768fe); live with the first two 26.5; live with all three (main) 21.2. On the H100 that
took breakable prefill at 256 tokens 5.00 -> 2.41 ms."""

from __future__ import annotations

import cProfile
import pstats
import sys
import time

import torch

from nanograph.kernels import attention, attention_hopper, pdl
from nanograph.kernels.launch import LaunchCache


class MockLaunches(LaunchCache):
    """Keys every launch as LaunchCache does; the 'compiled kernel' does nothing."""

    def __init__(self) -> None:
        super().__init__(None)
        self.enabled = True

    def _first_launch(self, key, grid, args, constexprs):
        self.runners[key] = ((lambda *a: None), ())


def main() -> None:
    n_tokens, live = int(sys.argv[1]), "live" in sys.argv
    triton_launches, hopper_launches = MockLaunches(), MockLaunches()
    attention._launch_attention = triton_launches
    attention_hopper._launch = hopper_launches
    attention_hopper._hopper = lambda device: True
    pdl.enabled = lambda t: True
    torch.Tensor.is_cuda = property(lambda self: True)  # this process only

    heads, kv_heads, dim, page, slots = 16, 8, 128, 16, 16  # a prefill graph's 16 slots
    bf16 = dict(dtype=torch.bfloat16)
    q = torch.randn(n_tokens, heads, dim, **bf16)
    k_cache = torch.zeros(8192, kv_heads, dim, **bf16)
    v_cache = torch.zeros_like(k_cache)
    page_table = torch.zeros(slots, 64, dtype=torch.int32)
    seq_lens = torch.zeros(slots, dtype=torch.int32)
    seq_lens[0] = n_tokens
    query_lens = seq_lens.clone()
    starts = torch.full((slots + 1,), n_tokens, dtype=torch.int32)
    starts[0] = 0
    out = torch.empty_like(q)
    new_kv = (torch.randn(n_tokens, kv_heads, dim, **bf16),) * 2
    extra = dict(query_len_range=(n_tokens, n_tokens)) if live else {}

    def call():
        attention.paged_attention(
            q, k_cache, v_cache, page_table, seq_lens, query_lens, starts, page, 0.08,
            max_query_len=n_tokens, out=out, new_kv=new_kv, **extra,
        )  # fmt: skip

    for _ in range(100):
        call()
    calls = 5000
    start = time.perf_counter()
    for _ in range(calls):
        call()
    us = (time.perf_counter() - start) / calls * 1e6
    total = calls + 100
    print(
        f"N={n_tokens} live={live}: {us:.1f} us a call; launches a call: hopper "
        f"{hopper_launches.direct_launches / total:.2f}, triton "
        f"{triton_launches.direct_launches / total:.2f}"
    )
    if "prof" in sys.argv:
        profile = cProfile.Profile()
        profile.runcall(lambda: [call() for _ in range(2000)])
        pstats.Stats(profile).sort_stats("tottime").print_stats(16)


if __name__ == "__main__":
    main()
