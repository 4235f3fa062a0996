#!/usr/bin/env bash
# Stop 73's device calls, from the repo root with NANOGRAPH_COMMIT exported and the wheels of
# benchmarks/serve_wheels.txt (+ xgrammar 0.2.9, apache-tvm-ffi) installed into /tmp/site:
#   bash docs/wip/stop73_calls.sh ab $OUT/r      # ~8 min: the router's norm on load against
#     the norm kernel (qwen3-30b-a3b), and the normalising GEMVs' weight loaded before their
#     PDL wait (docs/wip/gemv_norm_weight_before_wait.patch), alternating
#   bash docs/wip/stop73_calls.sh grid $OUT/g    # ~4 min: gemv_grid_rows_probe.py (issue 16)
#   bash docs/wip/stop73_calls.sh bias $OUT/b    # ~4 min: gpt-oss-20b, fused decode with biases
#   bash docs/wip/stop73_calls.sh route $OUT/q   # ~3 min (run at stop 74: -2.4%, dropped): the
#     MoE's routing in the pairwise gate/up kernel (docs/wip/moe_route_in_pair_gate_up.patch)
#     against the tree
#   bash docs/wip/stop73_calls.sh qwen2 $OUT/w   # ~3 min (run at stop 74): qwen2.5-0.5b fused vs
#     unfused (its q/k/v biases in the GEMV), gpt-oss-20b forced fused vs its default
#   bash docs/wip/stop73_calls.sh floor $OUT/f   # qwen3-30b-a3b's decode kernels at batch 1
#   bash docs/wip/stop73_calls.sh tests $OUT/t   # the GPU tests its change touches
# (stop72_calls.sh aims / tests hold the aims and the whole tests/gpu run.)
set -uo pipefail
stage=$1 out=$(mkdir -p "$2" && cd "$2" && pwd)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
bench() { local name=$1; shift; timeout "${LIMIT:-300}" python3 -m nanograph bench "$@" \
  --out "$out/$name.json" > "$out/$name.log" 2>&1; grep -v "^INFO" "$out/$name.log" | tail -2; }
ap() { if command -v patch > /dev/null; then patch -s -p1 $1 < "$2"; else git apply $1 "$2"; fi; }
patch_arm() {  # base: the router's change reversed; hoist: the norm weight before the wait
  case $1 in
    base) ap -R docs/wip/router_norm_landed.patch ;;
    hoist) ap '' docs/wip/gemv_norm_weight_before_wait.patch ;;
  esac; }
unpatch_arm() {
  case $1 in
    base) ap '' docs/wip/router_norm_landed.patch ;;
    hoist) ap -R docs/wip/gemv_norm_weight_before_wait.patch ;;
  esac; }
case $stage in
  ab)  # three trees alternating twice: qwen3-30b-a3b (router) and qwen3-0.6b (hoist only)
    i=0
    for arm in router base hoist router base hoist; do
      i=$((i + 1)); patch_arm $arm
      echo "== $i $arm"; bench decode_${i}_$arm decode --models qwen3-30b-a3b,qwen3-0.6b \
        --arms full --batches 1 --repeats 3
      unpatch_arm $arm
    done ;;
  grid)  # issue 16: the one-row GEMV with a program a (row, block), against the few-row kernel
    timeout 400 python3 docs/wip/gemv_grid_rows_probe.py qwen3-0.6b,qwen3-8b > "$out/grid.log" 2>&1
    grep "products a step" "$out/grid.log" ;;
  bias)  # gpt-oss-20b at batch 1: the fused decode with biases against the unfused (cuBLAS) path
    i=0
    for arm in base bias base bias; do
      i=$((i + 1)); [ $arm = base ] && ap -R docs/wip/fused_decode_bias_landed.patch
      echo "== $i $arm"; LIMIT=${LIMIT:-90} bench decode_${i}_$arm decode --models gpt-oss-20b \
        --arms full --batches 1 --repeats 2
      [ $arm = base ] && ap '' docs/wip/fused_decode_bias_landed.patch
    done ;;
  route)  # issue 15: routing inside the pairwise gate/up kernel (moe_route_in_pair_gate_up.patch)
    i=0
    for arm in tree route tree route; do
      i=$((i + 1)); [ $arm = route ] && ap '' docs/wip/moe_route_in_pair_gate_up.patch
      echo "== $i $arm"; bench decode_${i}_$arm decode --models qwen3-30b-a3b,gpt-oss-20b \
        --arms full --batches 1,8 --repeats 3
      [ $arm = route ] && ap -R docs/wip/moe_route_in_pair_gate_up.patch
    done ;;
  qwen2)  # not run yet: the biased fused decode where it applies, against the unfused path
    bench qwen2_fused decode --models qwen2.5-0.5b --arms full,full:unfused --batches 1,8 \
      --repeats 3
    bench gptoss_fused decode --models gpt-oss-20b --arms full,full:fused --batches 1 \
      --repeats 3 ;;
  floor)
    bench floor_30b floor --model qwen3-30b-a3b --decode-batch 1 --graph full ;;
  tests)
    timeout "${TEST_TIMEOUT:-400}" python3 -m pytest -q -p no:cacheprovider -rfE \
      tests/gpu/test_moe_gpu.py tests/gpu/test_fused_decode_gpu.py tests/gpu/test_gemv_gpu.py \
      > "$out/gpu_tests.log" 2>&1; grep -E "passed|failed|error" "$out/gpu_tests.log" | tail -4 ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
