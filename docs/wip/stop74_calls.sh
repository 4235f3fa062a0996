#!/usr/bin/env bash
# What stop 74 owes the device (it ran out of device time before this call), from the repo
# root with NANOGRAPH_COMMIT exported and stop 73's Triton cache unpacked:
#   bash docs/wip/stop74_calls.sh verify $OUT/v   # ~3 min on any H100/H200: 5b5c4a7 (`auto`
#     fuses MoE layers past hidden 2048): the GPU tests it touches first (stop 75: tests before
#     the bench, so a machine that ends early has run them), then gpt-oss-20b at batch 1 under
#     auto against unfused (expected ~327 against ~299 tok/s on an H100)
#   bash docs/wip/stop74_calls.sh layer $OUT/l    # ~3 min, on an H200: qwen3-30b-a3b's batch-1
#     decode graph kernel by kernel of a layer (decode_breakdown.py), where issue 15's last
#     ~58 us a step would have to come from (no H200 has profiled it since the router change)
# On an H200 also `bash docs/wip/stop72_calls.sh aims $OUT/a` (issue 15's 60%, issue 18).
set -uo pipefail
stage=$1 out=$(mkdir -p "$2" && cd "$2" && pwd)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
case $stage in
  verify)
    timeout "${TEST_TIMEOUT:-400}" python3 -m pytest -q -p no:cacheprovider -rfE \
      tests/gpu/test_fused_decode_gpu.py tests/gpu/test_moe_gpu.py > "$out/gpu_tests.log" 2>&1
    grep -E "passed|failed|error" "$out/gpu_tests.log" | tail -4
    timeout 150 python3 -m nanograph bench decode --models gpt-oss-20b --arms full,full:unfused \
      --batches 1 --repeats 3 --out "$out/gptoss_auto.json" > "$out/gptoss_auto.log" 2>&1
    grep -E "decode=|best arm" "$out/gptoss_auto.log" ;;
  layer)
    cp docs/wip/decode_breakdown.py /tmp/ && timeout 300 python3 /tmp/decode_breakdown.py \
      "$out" qwen3-30b-a3b > "$out/breakdown.log" 2>&1; tail -25 "$out/breakdown.log" ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
