#!/usr/bin/env bash
# Stop 76's device calls, from the repo root with NANOGRAPH_COMMIT exported and the Triton
# cache of stop 76's first call unpacked:
#   bash docs/wip/stop76_calls.sh nn $OUT/n   # ~8 min, any H100/H200: 5b5c4a7's GPU tests
#     (test_fused_decode_gpu.py, test_moe_gpu.py: two processes, warm cache), then gpt-oss-20b's
#     and qwen3-30b-a3b's native breakable prefill at 256 tokens against eager, as committed and
#     with docs/wip/native_experts_nn.patch applied (the probe put the NN loop 8% ahead on
#     gpt-oss-20b), the patch reverted afterwards
set -uo pipefail
stage=$1 out=$(mkdir -p "$2" && cd "$2" && pwd)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
bench() { local name=$1; shift; timeout "${LIMIT:-150}" python3 -m nanograph bench "$@" \
  --out "$out/$name.json" > "$out/$name.log" 2>&1; grep -v "^INFO" "$out/$name.log" | tail -5; }
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
  *) echo "unknown stage $stage"; exit 2 ;;
esac
