"""The engine on CUDA in bf16: qwen3-0.6b (random init) against transformers, and bf16 greedy
against float32 eager. Agreement figures are printed (run with -s) for the issue notes."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

CUDA = torch.device("cuda")


def qwen3_06b_pair(dtype: torch.dtype):
    """transformers' Qwen3 and ours with the same random weights (qwen3-0.6b preset config)."""
    from nanograph.loader import load_weights, resolve_model
    from nanograph.models import build_model
    from nanograph.models.reference import transformers_model

    config = resolve_model("qwen3-0.6b", "dummy").config
    torch.manual_seed(0)
    hf = transformers_model(config, dtype, CUDA)
    ours = build_model(config, dtype, CUDA)
    load_weights(ours, hf.state_dict().items(), progress=False)
    return config, hf, ours


def prefill_logits(model, config, ids: list[int], dtype, attention: str = "triton"):
    from nanograph.attention import get_attention_backend
    from nanograph.engine.kv_cache import KVCache
    from nanograph.runners.forward_batch import ForwardBatch
    from nanograph.runners.model_runner import ModelRunner

    kv = KVCache(config, num_pages=len(ids) // 16 + 2, page_size=16, dtype=dtype, device=CUDA)
    pages = kv.allocator.allocate(kv.pages_needed(len(ids)))
    batch = ForwardBatch.build([ids], [0], [pages], 16, [True])
    batch = ForwardBatch(**{**batch.__dict__, "sample_rows": list(range(len(ids)))})
    runner = ModelRunner(model, get_attention_backend(attention, CUDA), kv.k, kv.v, CUDA)
    return runner.forward(batch)


@pytest.mark.parametrize("attention", ["triton", "torch_native"])
def test_qwen3_06b_bf16_matches_transformers(attention):
    config, hf, ours = qwen3_06b_pair(torch.bfloat16)
    ids = torch.randint(0, config.vocab_size, (300,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids[None].to(CUDA)).logits[0].float()
    got = prefill_logits(ours, config, ids.tolist(), torch.bfloat16, attention)
    rel = ((got - ref).norm() / ref.norm()).item()
    agree = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
    print(
        f"\nqwen3-0.6b bf16 {attention} vs transformers: "
        f"rel err {rel:.2e}, argmax agree {agree:.3f}"
    )
    assert rel < 3e-2
    assert agree > 0.9


def test_bf16_greedy_agrees_with_float32_eager():
    """64 greedy tokens in bf16 vs float32, teacher-forced on the float32 tokens so one early
    flip does not cascade: report per-position agreement of the argmax."""
    from nanograph import LLM, SamplingParams

    params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    prompt = torch.randint(0, 151936, (32,), generator=torch.Generator().manual_seed(2)).tolist()
    fp32 = LLM("qwen3-0.6b", load_format="dummy", dtype="float32", progress=False,
               decode_cuda_graph="none", prefill_cuda_graph="none", mem_fraction=0.3)  # fmt: skip
    ref_tokens = fp32.generate([prompt], params)[0].token_ids
    model32 = fp32.engine.model
    del fp32
    from nanograph.loader import resolve_model
    from nanograph.models import build_model

    config = resolve_model("qwen3-0.6b", "dummy").config
    model16 = build_model(config, torch.bfloat16, CUDA)
    model16.load_state_dict({k: v.to(torch.bfloat16) for k, v in model32.state_dict().items()})
    model16.build_rotary()
    seq = prompt + ref_tokens
    logits = prefill_logits(model16, config, seq, torch.bfloat16)
    predicted = logits.argmax(-1)[len(prompt) - 1 : -1].tolist()
    agree = sum(a == b for a, b in zip(predicted, ref_tokens)) / len(ref_tokens)
    print(f"\nbf16 vs float32 greedy (teacher-forced, 64 tokens): {agree:.3f} agreement")
    assert agree > 0.75
