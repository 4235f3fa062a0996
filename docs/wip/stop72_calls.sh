#!/usr/bin/env bash
# Stop 72's device calls, from the repo root with NANOGRAPH_COMMIT exported and the wheels of
# benchmarks/serve_wheels.txt (+ xgrammar 0.2.9, apache-tvm-ffi) installed into /tmp/site:
#   bash docs/wip/stop72_calls.sh aims $OUT/a    # ~7 min: issue 15's and 18's H200 figures
#   bash docs/wip/stop72_calls.sh tests $OUT/t   # ~8 min: every tests/gpu file but TP
set -uo pipefail
stage=$1 out=$(mkdir -p "$2" && cd "$2" && pwd)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
bench() { local name=$1; shift; timeout "${LIMIT:-300}" python3 -m nanograph bench "$@" \
  --out "$out/$name.json" > "$out/$name.log" 2>&1; grep -v "^INFO" "$out/$name.log" | tail -4; }
case $stage in
  aims)  # issue 15: qwen3-30b-a3b batch-1 decode (60%), native breakable prefill at 256 (1.5x);
         # issue 18: batch-1 decode of qwen3-0.6b and qwen3-8b
    bench decode_b1 decode --models qwen3-30b-a3b,qwen3-0.6b,qwen3-8b --arms full --batches 1 \
      --repeats 3
    bench native_prefill prefill --models gpt-oss-20b,qwen3-30b-a3b --lengths 256 \
      --arms breakable --moe-backend torch_native --peer-lengths '' --repeats 9 --eager-beside ;;
  tests)
    groups=("test_engine_gpu.py test_front_gpu.py" "test_moe_gpu.py test_spec_gpu.py"
      "test_graph_backends.py test_graph_memory.py test_runners_gpu.py"
      "test_sampling_gpu.py test_live_capture_gpu.py test_prefix_gpu.py test_hardening_gpu.py"
      "test_kernels_attention.py test_kernels_fused.py test_gemv_gpu.py test_fused_decode_gpu.py")
    for i in "${!groups[@]}"; do
      timeout "${TEST_TIMEOUT:-500}" python3 -m pytest -q -p no:cacheprovider --durations=5 -rfE \
        $(printf 'tests/gpu/%s ' ${groups[$i]}) > "$out/gpu_tests_$i.log" 2>&1 &
    done
    wait; for f in "$out"/gpu_tests_*.log; do grep -E "passed|failed|error" "$f" | tail -4; done ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
