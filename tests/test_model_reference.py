"""Our model against transformers' reference implementation, same random weights (float32)."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY, make_hf_model

from nanograph.attention import get_attention_backend
from nanograph.attention.op import ForwardContext, forward_context
from nanograph.engine.kv_cache import KVCache
from nanograph.loader import load_weights
from nanograph.models import build_model
from nanograph.models.config import ModelConfig
from nanograph.runners.attention_inputs import eager_inputs
from nanograph.runners.forward_batch import ForwardBatch

CPU = torch.device("cpu")
TORCH_NATIVE = get_attention_backend("torch_native", CPU)


def ours_from(hf_model, arch: str):
    config = ModelConfig.from_hf_dict(TINY[arch])
    model = build_model(config, torch.float32, CPU)
    load_weights(model, hf_model.state_dict().items(), progress=False)
    kv = KVCache(config, num_pages=64, page_size=4, dtype=torch.float32, device=CPU)
    return model, kv


def run_chunks(model, kv, ids: list[int], chunks: list[int]) -> torch.Tensor:
    """Feeds ``ids`` in chunks through the paged cache; returns logits of every position."""
    pages = kv.allocator.allocate(kv.pages_needed(len(ids)))
    out, done = [], 0
    for n in chunks:
        batch = ForwardBatch.build([ids[done : done + n]], [done], [pages], kv.page_size, [True])
        ctx = ForwardContext(TORCH_NATIVE, eager_inputs(batch, CPU)[2], kv.k, kv.v)
        with forward_context(ctx):
            hidden = model(torch.tensor(batch.input_ids), torch.tensor(batch.positions))
        out.append(model.compute_logits(hidden))
        done += n
    kv.allocator.free(pages)
    return torch.cat(out)


@pytest.mark.parametrize("arch", ["qwen3", "llama", "qwen2"])
def test_logits_match_transformers(arch):
    hf = make_hf_model(arch)
    model, kv = ours_from(hf, arch)
    ids = torch.randint(0, 256, (1, 37), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids).logits[0]
    ours = run_chunks(model, kv, ids[0].tolist(), [37])
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)
    # chunked prefill (7-token chunks) through the paged prefix gives the same logits
    chunked = run_chunks(model, kv, ids[0].tolist(), [7, 7, 7, 7, 7, 2])
    torch.testing.assert_close(chunked, ref, atol=1e-4, rtol=1e-4)


def test_config_round_trip():
    for arch, d in TINY.items():
        config = ModelConfig.from_hf_dict(d)
        assert ModelConfig.from_hf_dict(config.to_hf_dict()) == config, arch
    assert ModelConfig.from_hf_dict(TINY["qwen3"]).qk_norm
    assert ModelConfig.from_hf_dict(TINY["qwen2"]).attention_bias


def test_unsupported_architecture_is_a_clear_error():
    with pytest.raises(ValueError, match="unsupported model_type 'mamba'"):
        ModelConfig.from_hf_dict({**TINY["llama"], "model_type": "mamba"})


def test_hf_state_dict_round_trip():
    """Our weights exported under HF names rebuild the same transformers model."""
    from nanograph.models.reference import transformers_model

    hf = make_hf_model("qwen3")
    model, _ = ours_from(hf, "qwen3")
    rebuilt = transformers_model(model.config, state_dict=model.hf_state_dict())
    ids = torch.randint(0, 256, (1, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(ids).logits, hf(ids).logits, atol=1e-5, rtol=1e-5)
