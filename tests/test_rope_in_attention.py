"""The attention kernel's rotary and KV store (``RopeStore``) in engine forwards on CPU
(TRITON_INTERPRET=1): decodes of several rows take it, speculative verifies do not, and the
greedy tokens are torch-native attention's without speculation.

TRITON_INTERPRET is read when a kernel is decorated, so it is set before the Triton kernel
modules are imported (reloaded if something imported them earlier). Skipped on a machine with
CUDA: tests/gpu cover the compiled kernel there.
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch

if torch.cuda.is_available():
    pytest.skip("CUDA present: tests/gpu cover the compiled kernels", allow_module_level=True)
os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

# the kernel's module before the one that binds it
for _name in ("nanograph.kernels.attention_kernel", "nanograph.kernels.attention",
              "nanograph.kernels.fused"):  # fmt: skip
    if _name in sys.modules:
        importlib.reload(sys.modules[_name])
from nanograph import LLM, SamplingParams  # noqa: E402
from nanograph.attention.triton_backend import TritonAttention  # noqa: E402


@pytest.mark.parametrize("algorithm", [None, "ngram", "draft_model"])
def test_forwards_rotating_in_the_attention_kernel_give_the_reference_tokens(
    tiny_model_dir, monkeypatch, algorithm
):
    """Three requests decoded together (several rows a decode; with a draft model, its draft
    steps) rotate and store their keys in the attention kernel (``forward_rope``); verifies
    of k + 1 = 4 tokens a request take rope_store_kv; the greedy tokens equal torch-native
    attention's without speculation. The draft model is the target itself."""
    path = str(tiny_model_dir("qwen3"))
    rows = []
    real = TritonAttention.forward_rope

    def counted(self, q, k, v, rope, k_cache, v_cache, meta, *args, **kwargs):
        rows.append((q.shape[0], meta.max_query_len))
        return real(self, q, k, v, rope, k_cache, v_cache, meta, *args, **kwargs)

    g = torch.Generator().manual_seed(3)
    unit = torch.randint(0, 256, (5,), generator=g).tolist()
    prompts = [unit * 3, torch.randint(0, 256, (11,), generator=g).tolist(), unit * 2 + [7]]
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    common = dict(dtype="float32", page_size=4, kv_cache_bytes=2**20, progress=False)
    reference = LLM(path, attention_backend="torch_native", **common)
    want = [o.token_ids for o in reference.generate(prompts, params)]
    reference.close()
    spec = {}
    if algorithm is not None:
        spec = dict(speculative_algorithm=algorithm, speculative_num_draft_tokens=3)
    if algorithm == "draft_model":
        spec["speculative_draft_model_path"] = path
    monkeypatch.setattr(TritonAttention, "forward_rope", counted)
    llm = LLM(path, attention_backend="triton", **common, **spec)
    assert [o.token_ids for o in llm.generate(prompts, params)] == want
    assert max(n for n, _ in rows) > 1  # forwards of several rows rotated in the kernel
    assert all(query_len == 1 for _, query_len in rows)  # decodes only
