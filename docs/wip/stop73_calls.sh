#!/usr/bin/env bash
# Stop 73's device calls, from the repo root with NANOGRAPH_COMMIT exported and the wheels of
# benchmarks/serve_wheels.txt (+ xgrammar 0.2.9, apache-tvm-ffi) installed into /tmp/site:
#   bash docs/wip/stop73_calls.sh ab $OUT/r      # ~7 min: the router's norm on load against
#                                                # the norm kernel, alternating (qwen3-30b-a3b)
#   bash docs/wip/stop73_calls.sh tests $OUT/t   # the GPU tests its change touches
# (stop72_calls.sh aims / tests hold the aims and the whole tests/gpu run.)
set -uo pipefail
stage=$1 out=$(mkdir -p "$2" && cd "$2" && pwd)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
bench() { local name=$1; shift; timeout "${LIMIT:-300}" python3 -m nanograph bench "$@" \
  --out "$out/$name.json" > "$out/$name.log" 2>&1; grep -v "^INFO" "$out/$name.log" | tail -2; }
patch_arm() {  # base: the landed change reversed (docs/wip/router_norm_landed.patch)
  if [ "$1" = base ]; then patch -s -p1 -R < docs/wip/router_norm_landed.patch \
    || git apply -R docs/wip/router_norm_landed.patch; fi; }
unpatch_arm() { if [ "$1" = base ]; then patch -s -p1 < docs/wip/router_norm_landed.patch \
    || git apply docs/wip/router_norm_landed.patch; fi; }
case $stage in
  ab)
    i=0
    for arm in new base new base; do
      i=$((i + 1)); patch_arm $arm
      echo "== $i $arm"; bench decode_30b_${i}_$arm decode --models qwen3-30b-a3b --arms full \
        --batches 1 --repeats 3
      unpatch_arm $arm
    done
    bench floor_30b_new floor --model qwen3-30b-a3b --decode-batch 1 --graph full ;;
  tests)
    timeout "${TEST_TIMEOUT:-400}" python3 -m pytest -q -p no:cacheprovider -rfE \
      tests/gpu/test_moe_gpu.py tests/gpu/test_fused_decode_gpu.py tests/gpu/test_gemv_gpu.py \
      > "$out/gpu_tests.log" 2>&1; grep -E "passed|failed|error" "$out/gpu_tests.log" | tail -4 ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
