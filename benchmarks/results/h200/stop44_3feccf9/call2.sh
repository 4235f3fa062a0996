#!/usr/bin/env bash
# stop 44 call 2: the MoE block kernel in a graph of 24 30b-shaped layers against the kernels
# it replaces; its GPU tests and the fused-decode ones.
set -uo pipefail
out=$(mkdir -p "$1" && cd "$1" && pwd)
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p ~/.triton && tar xzf .triton_cache.tgz -C ~/.triton
timeout 240 python3 ab/moe_block_bench.py > "$out/bench.log" 2>&1; echo "bench rc=$?" >> "$out/bench.log"
cat "$out/bench.log"
timeout 240 python3 -m pytest -q -p no:cacheprovider -x tests/gpu/test_moe_gpu.py -k "moe_block or fused_decode" \
  tests/gpu/test_fused_decode_gpu.py > "$out/tests.log" 2>&1
tail -3 "$out/tests.log"; grep -E "^(FAILED|ERROR)" "$out/tests.log"
