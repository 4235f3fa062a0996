"""The engine's async front on CUDA: the engine steps in its own thread, replaying the graphs
the main thread captured. Requests through the front, concurrent, get the tokens that
``LLM.generate`` gives each alone (greedy), and every page comes back. float32 keeps greedy ties
of the random weights out of the comparison (alone runs batch 1, the front batches four). The
small Qwen3 of the other GPU tests: its float32 kernels are theirs (qwen3-0.6b's took minutes
to compile on a fresh machine). The process front (``--engine-process``) passes the same test
with its engine built in a spawned child from the same config: CUDA initialised there, not
inherited."""

from __future__ import annotations

import asyncio

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_front_on_cuda_matches_generate_alone(small_qwen3):
    from nanograph import LLM, SamplingParams
    from nanograph.engine.front import EngineFront

    llm = LLM(
        small_qwen3("front"),
        dtype="float32",
        cuda_graph_bs=(1, 2, 4, 8),
        max_num_seqs=8,
        prefill_cuda_graph="breakable",
        max_model_len=1024,
        progress=False,
        cuda_graph_capture="startup",  # the graphs are in place before the first request
    )
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 4096, (int(n),), generator=g).tolist() for n in (5, 40, 300, 17)]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    alone = [llm.generate([p], params)[0].token_ids for p in prompts]
    engine = llm.engine
    front = EngineFront(engine)

    before = engine.runner.forward_counts()["decode"]["graph"]
    got = asyncio.run(through_front(front, prompts, params))
    for i, (g_ids, a_ids) in enumerate(zip(got, alone)):
        assert g_ids == a_ids, f"prompt {i} ({len(prompts[i])} tokens): front {g_ids} alone {a_ids}"
    assert engine.runner.forward_counts()["decode"]["graph"] > before  # graphs replayed
    assert engine.scheduler.num_available_pages == engine.kv_cache.allocator.num_usable


def test_process_front_on_cuda_matches_generate_alone(small_qwen3):
    from nanograph import LLM, SamplingParams
    from nanograph.engine.config import EngineConfig
    from nanograph.engine.process_front import ProcessFront

    # a KV pool capped by max_num_seqs x max_model_len: the child's fits beside this process's.
    # Graphs captured at start-up: with background capture the child may serve every request
    # before its graphs are ready (seen with four other test processes on the GPU), and the
    # assertion below that it replayed one would fail for want of time, not of correctness
    kwargs = dict(
        dtype="float32",
        cuda_graph_capture="startup",
        cuda_graph_bs=(1, 2, 4, 8),
        max_num_seqs=8,
        prefill_cuda_graph="breakable",
        max_model_len=1024,
        progress=False,
    )
    model = small_qwen3("front")
    llm = LLM(model, **kwargs)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 4096, (int(n),), generator=g).tolist() for n in (5, 40, 300, 17)]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    alone = [llm.generate([p], params)[0].token_ids for p in prompts]
    front = ProcessFront(EngineConfig(model=model, **kwargs))

    try:
        got = asyncio.run(through_front(front, prompts, params))
    finally:
        front.close()
    for i, (g_ids, a_ids) in enumerate(zip(got, alone)):
        assert g_ids == a_ids, f"prompt {i} ({len(prompts[i])} tokens): front {g_ids} alone {a_ids}"
    stats = front.stats  # the child's last snapshot, from before it exited
    assert stats.forward_counts["decode"]["graph"] > 0  # the child captured and replayed
    assert stats.kv_pages_available == stats.kv_pages_total
    assert front._process.exitcode == 0


async def through_front(front, prompts, params) -> list[list[int]]:
    """Each prompt's tokens, all submitted at once through a started ``front``, which is stopped
    afterwards."""
    front.start()
    streams = [front.submit(p, params) for p in prompts]

    async def collect(stream) -> list[int]:
        await stream.admitted()
        return [t async for u in stream.updates() for t in u.token_ids]

    try:
        return await asyncio.wait_for(asyncio.gather(*map(collect, streams)), 120)
    finally:
        await asyncio.to_thread(front.stop, 10)
