#!/usr/bin/env bash
# Stop 63's device calls, from the repo root with NANOGRAPH_COMMIT exported:
#   bash docs/wip/stop63_calls.sh tests $OUT/t   # ~5 min: tests/gpu but TP and kernel files
#   bash docs/wip/stop63_calls.sh tests_core $OUT/t  # ~4 min: memory plan, hardening, engine,
#                                                   # front and MoE files only
#   bash docs/wip/stop63_calls.sh spec_cold $OUT/s  # ~7 min: bench spec's loop figures, then
#                                                   # gpt-oss-20b's cold start-up without and
#                                                   # with moe_compile_ahead.patch
#   bash docs/wip/stop63_calls.sh aims $OUT/a    # ~7 min: stop62_calls.sh's, on an H200
# PREDICTED for spec (H100, qwen3-8b target; stop 61's figures): the two-token draft loop
# ~1.07x four drafter steps back to back, the one-token loop ~0.98x; draft:4 (dummy weights,
# nothing kept whole) as run = the one-token loop's, self:4 (every draft kept) = the
# two-token loop's. PREDICTED for cold: gpt-oss-20b ready several seconds sooner with the
# patch (its MoE variants compiled on the pool's threads beside attention's, not one by one
# in the pass's forwards); 0 compiles after ready in both.
set -uo pipefail
stage=$1 out=$(mkdir -p "$2" && cd "$2" && pwd)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
case $stage in
  aims) exec bash docs/wip/stop62_calls.sh "$stage" "$out" ;;
  tests_core)  # ~4 min: the files whose engines c50fbe7's memory plan changes
    T=${TEST_TIMEOUT:-230}
    timeout "$T" python3 -m pytest -q -p no:cacheprovider -rfE tests/gpu/test_graph_memory.py \
      tests/gpu/test_hardening_gpu.py > "$out/memory.log" 2>&1 &
    timeout "$T" python3 -m pytest -q -p no:cacheprovider -rfE tests/gpu/test_engine_gpu.py \
      tests/gpu/test_front_gpu.py > "$out/engine.log" 2>&1 &
    timeout "$T" python3 -m pytest -q -p no:cacheprovider -rfE tests/gpu/test_moe_gpu.py \
      > "$out/moe.log" 2>&1 &
    wait; for f in "$out"/*.log; do grep -E "passed|failed|error" "$f" | tail -4; done ;;
  tests)  # ~5 min: tests/gpu but TP and the kernel files (untouched since 406b2d3: passed)
    groups=("test_engine_gpu.py test_front_gpu.py" "test_moe_gpu.py test_spec_gpu.py"
      "test_graph_backends.py test_graph_memory.py test_runners_gpu.py"
      "test_sampling_gpu.py test_live_capture_gpu.py test_prefix_gpu.py test_hardening_gpu.py")
    for i in "${!groups[@]}"; do
      timeout 320 python3 -m pytest -q -p no:cacheprovider --durations=5 -rfE \
        $(printf 'tests/gpu/%s ' ${groups[$i]}) > "$out/gpu_tests_$i.log" 2>&1 &
    done
    wait; for f in "$out"/gpu_tests_*.log; do grep -E "passed|failed|error" "$f" | tail -4; done ;;
  spec_cold|cold)  # cold: only the start-ups (~3 min)
    [ "$stage" = cold ] || bash docs/wip/stop62_calls.sh spec "$out"
    # one cold start-up a tree (bench startup's child: a fresh Triton and Inductor cache)
    cold() {
      local cache; cache=$(mktemp -d)
      TRITON_CACHE_DIR=$cache/triton TORCHINDUCTOR_CACHE_DIR=$cache/inductor timeout 200 \
        python3 -m nanograph.bench.startup --child --model gpt-oss-20b --new-tokens 8 \
        --engine-args '{"load_format": "dummy", "dtype": "bfloat16", "disable_prefix_caching":
        true, "cuda_graph_capture": "startup"}' > "$out/cold_$1.json" 2> "$out/cold_$1.log"
      echo "== $1 rc=$?"; python3 - "$out/cold_$1.json" <<'PY'
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print("ready", round(r["ready_s"], 1), {k: round(v, 1) for k, v in r["phases"].items()})
print("compiles to ready", r["compiles_to_ready"]["compiled"],
      round(r["compiles_to_ready"]["compile_s"], 1), "after", r["compiles_after_ready"]["compiled"])
print({k: round(v["latency_s"] * 1e3) for k, v in r["requests"].items()})
PY
      rm -rf "$cache"
    }
    cold main
    git apply docs/wip/moe_compile_ahead.patch && cold patch
    git apply -R docs/wip/moe_compile_ahead.patch ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
