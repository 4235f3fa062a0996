"""Compute kernels: Triton kernels with explicit tensor arguments and their torch references.

Modules (imported lazily so ``import nanograph.kernels`` never imports triton):
- ``argmax``: row-wise argmax of logits (the greedy pick), one launch.
- ``attention``: graph-safe paged attention (extend, decode with split-KV, target-verify).
- ``attention_tiles``: its launch configurations, from static sizes only.
- ``fused``: fused elementwise kernels (rmsnorm, add_rmsnorm, silu_and_mul, rope_store_kv).
- ``gemv``: one-row products for batch-1 decode (launched as programmatic dependents).
- ``moe``: the graph-safe fused mixture-of-experts (routing, pairwise GEMVs for a few tokens,
  expert-sorted grouped GEMMs for more).
- ``pdl``: whether a device takes programmatic dependent launches (sm_90+).
- ``reference``: plain-torch implementations of every kernel with the same signatures, used by
  tests and as the CPU path.

Layouts shared by all of them (the engine relies on these):
- KV cache of one layer: ``[num_slots, num_kv_heads, head_dim]``, where
  ``slot = page_id * page_size + offset_in_page``.
- Tokens are flat: ``q [N, num_q_heads, head_dim]``; request ``r`` owns rows
  ``query_start_loc[r] : query_start_loc[r] + query_lens[r]``; rows at or past
  ``query_start_loc[S]`` are padding.
"""
