#!/usr/bin/env bash
# Stop 75's device call, from the repo root with NANOGRAPH_COMMIT exported and stop 73's Triton
# cache unpacked (starts failed most of the session, so everything owed is in one call):
#   bash docs/wip/stop75_calls.sh first $OUT   # ~6-9 min: stop74_calls.sh verify (5b5c4a7's
#     GPU tests and gpt-oss-20b's batch-1 decode under auto against unfused), the native MoE
#     products probe, and on an H200 issue 15's batch-1 decode of qwen3-30b-a3b (60% aim; 58%
#     at stop 68, ~58.6% expected after stop 73's router change)
set -uo pipefail
stage=$1 out=$(mkdir -p "$2" && cd "$2" && pwd)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
case $stage in
  first)
    TEST_TIMEOUT=240 bash docs/wip/stop74_calls.sh verify "$out/v"
    mkdir -p "$out/p"
    timeout 90 python3 docs/wip/native_products_probe.py "$out/p/products.json" \
      > "$out/p/products.log" 2>&1; tail -16 "$out/p/products.log"
    if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
      mkdir -p "$out/a"
      timeout 150 python3 -m nanograph bench decode --models qwen3-30b-a3b --arms full \
        --batches 1 --repeats 3 --out "$out/a/decode_30b.json" > "$out/a/decode_30b.log" 2>&1
      grep -E "decode=|best arm|kernels" "$out/a/decode_30b.log"
    fi ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
