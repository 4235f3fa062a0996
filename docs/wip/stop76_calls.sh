#!/usr/bin/env bash
# Stop 76's device calls, from the repo root with NANOGRAPH_COMMIT exported and the Triton
# cache of stop 76's first call unpacked:
#   bash docs/wip/stop76_calls.sh nn $OUT/n   # ~8 min, any H100/H200: 5b5c4a7's GPU tests
#     (test_fused_decode_gpu.py, test_moe_gpu.py: two processes, warm cache), then gpt-oss-20b's
#     and qwen3-30b-a3b's native breakable prefill at 256 tokens against eager, as committed and
#     with docs/wip/native_experts_nn.patch applied (the probe put the NN loop 8% ahead on
#     gpt-oss-20b), the patch reverted afterwards
#   bash docs/wip/stop76_calls.sh bias $OUT/b  # ~5 min, any H100/H200 (+2 on an H200): the
#     MXFP4 test the `nn` call's timeout cut and test_moe_gpu's native tests (stop 76 ran them
#     in two processes at once; `patched_ab` runs them in one), both with
#     docs/wip/native_bias_rows.patch (the native loop's products without biases: plain
#     cuBLAS mm, not cuBLASLt's addmm, the biases added over all rows); gpt-oss-20b's native
#     breakable prefill at 256 against eager, patched and as committed, alternating twice;
#     on an H200, issue 15's and 18's batch-1 decode aims
#   bash docs/wip/stop76_calls.sh both $OUT/o  # ~3 min, any H100/H200: gpt-oss-20b's native
#     breakable prefill with native_experts_nn.patch and native_bias_rows.patch applied together
#     (each alone left the breakable arm level: is the loop bound by host and GPU at once?)
#     against 044565b's loop, alternating twice; the native GPU tests with both first
#   bash docs/wip/stop76_calls.sh gaps $OUT/g  # ~1.5 min, any H100/H200: the GPU's idle gaps in
#     one profiled gpt-oss-20b native prefill, eager and breakable, by the kernels around them
#     (native_tc_profile.py's gap report): sync bubbles, a host-bound loop or the activation
set -uo pipefail
stage=$1 out=$(mkdir -p "$2" && cd "$2" && pwd)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
bench() { local name=$1; shift; timeout "${LIMIT:-150}" python3 -m nanograph bench "$@" \
  --out "$out/$name.json" > "$out/$name.log" 2>&1; grep -v "^INFO" "$out/$name.log" | tail -5; }
# patched_ab LABEL PATCH...: the patches applied, test_moe_gpu.py's native tests (and the MXFP4
# test, which runs the triton experts the patches leave alone), then gpt-oss-20b's native
# breakable prefill at 256 against eager, patched (LABEL1, LABEL2) and as committed (base1,
# base2), alternating twice; the tree is left as committed
patched_ab() {
  local label=$1; shift
  for f in "$@"; do git apply "$f" || return 1; done
  timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE tests/gpu/test_moe_gpu.py \
    -k "torch_native or native_per_layer or mxfp4_gpt_oss_20b_dummy" > "$out/native_tests.log" 2>&1
  tail -1 "$out/native_tests.log"
  local args=(prefill --models gpt-oss-20b --lengths 256 --arms breakable --moe-backend
    torch_native --peer-lengths '' --repeats 15 --eager-beside)
  for round in 1 2; do
    bench "$label$round" "${args[@]}"
    for f in "$@"; do git apply -R "$f"; done
    bench "base$round" "${args[@]}"
    if [ $round = 1 ]; then for f in "$@"; do git apply "$f"; done; fi
  done
}
case $stage in
  nn)
    for f in test_fused_decode_gpu.py test_moe_gpu.py; do
      timeout "${TEST_TIMEOUT:-200}" python3 -m pytest -q -p no:cacheprovider -rfE "tests/gpu/$f" \
        > "$out/${f%.py}.log" 2>&1 &
    done
    wait; for f in "$out"/test_*.log; do grep -E "passed|failed|error" "$f" | tail -3; done
    args=(prefill --lengths 256 --arms breakable --moe-backend torch_native --peer-lengths ''
      --repeats 9 --eager-beside)
    bench tn_gptoss "${args[@]}" --models gpt-oss-20b
    git apply docs/wip/native_experts_nn.patch && {
      bench nn_gptoss "${args[@]}" --models gpt-oss-20b
      bench nn_q30 "${args[@]}" --models qwen3-30b-a3b
      git apply -R docs/wip/native_experts_nn.patch; }
    bench tn_q30 "${args[@]}" --models qwen3-30b-a3b ;;
  bias)
    patched_ab bias docs/wip/native_bias_rows.patch
    if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
      bench decode_b1 decode --models qwen3-30b-a3b,qwen3-0.6b,qwen3-8b --arms full \
        --batches 1 --repeats 3
    fi ;;
  both) patched_ab both docs/wip/native_experts_nn.patch docs/wip/native_bias_rows.patch ;;
  gaps)
    timeout 200 python3 docs/wip/native_tc_profile.py gpt-oss-20b none,breakable \
      > "$out/gaps.log" 2>&1; grep -E "^==|^-- |^   [a-p]" "$out/gaps.log" ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
