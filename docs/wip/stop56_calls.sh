#!/usr/bin/env bash
# For the next device session (stop 55 landed the three host-cost patches its live_tests and
# live_bench stages measured: benchmarks/results/h100/stop55_8962cf1/COMMAND.md).
# From the repo root with NANOGRAPH_COMMIT exported, most important first:
#   bash docs/wip/stop56_calls.sh verify $OUT/v  # ~3 min: the attention and graph-backend GPU
#     tests (the live-range test's fixed expectation, 4660053, never ran on a GPU)
#   bash docs/wip/stop56_calls.sh spec_tests $OUT/s  # ~2 min: tests/gpu/test_spec_gpu.py with
#     the draft loop's one-launch input advance (kernels/draft_inputs.py)
#   bash docs/wip/stop56_calls.sh draft_ab $OUT/d  # ~4 min: issue 16's draft loop over k
#     drafter steps (device time) with that advance and without it
#   bash docs/wip/stop56_calls.sh native_ab $OUT/n  # ~5 min: issue 15's native-MoE ratio with
#     the experts' weights pre-transposed (no .t() an expert) against before, alternating
# spec_tests and draft_ab need docs/wip/draft_advance.patch applied in the tree sent, and
# native_ab docs/wip/native_pretransposed.patch (git apply both here, send, then git apply -R).
#   bash docs/wip/stop56_calls.sh h200 $OUT/h    # ~8 min, on an H200 only: issue 18's figures
#     there with the Hopper extend (0.6b prefill, every arm and the peer; attention)
set -uo pipefail
stage=$1 out=$(mkdir -p "$2" && cd "$2" && pwd)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv > "$out/gpu_$stage.txt"
case $stage in
  verify)
    timeout 400 python3 -m pytest -q tests/gpu/test_kernels_attention.py \
      tests/gpu/test_graph_backends.py > "$out/tests.log" 2>&1
    tail -n 3 "$out/tests.log" ;;
  spec_tests)  # the draft loop's one-launch input advance (draft_advance.patch) on the GPU
    timeout 400 python3 -m pytest -q tests/gpu/test_spec_gpu.py > "$out/spec_tests.log" 2>&1
    tail -n 3 "$out/spec_tests.log" ;;
  draft_ab)  # issue 16: the draft loop with the one-launch advance (in the tree sent) and
    # without it (draft_advance.patch reversed): device time of the loop over k drafter steps
    for arm in after before; do
      [ $arm = before ] && { git apply -R docs/wip/draft_advance.patch || exit 2; }
      timeout 250 python3 -m nanograph bench spec --target qwen3-0.6b --drafter qwen3-0.6b \
        --arms self:4 --batches 1,4 --new-tokens 64 --repeats 3 \
        --out "$out/spec_$arm.json" > "$out/spec_$arm.log" 2>&1
      [ $arm = before ] && git apply docs/wip/draft_advance.patch
      echo "== $arm"; grep -E "batch [0-9]+:" "$out/spec_$arm.log" \
        | grep -oE "batch [0-9]+|'draft_loop[a-z_]*': [0-9.]+|'drafter_decode': [0-9.]+"
    done ;;
  native_ab)  # issue 15: the native MoE's weights pre-transposed (native_pretransposed.patch,
    # applied in the tree sent) against the .t() an expert before it, alternating, two each
    for i in $(seq "${RUNS:-2}"); do
      for arm in after before; do
        [ $arm = before ] && { git apply -R docs/wip/native_pretransposed.patch || exit 2; }
        timeout 170 python3 -m nanograph bench prefill --models gpt-oss-20b,qwen3-30b-a3b \
          --lengths 256 --arms eager,breakable --moe-backend torch_native --peer-lengths '' \
          --repeats 15 --out "$out/native_${arm}_$i.json" 2>&1 | grep -v "^INFO" \
          > "$out/native_${arm}_$i.log"
        [ $arm = before ] && git apply docs/wip/native_pretransposed.patch
        echo "== $arm $i"; grep -A2 "speedup over eager" "$out/native_${arm}_$i.log"
      done
    done ;;
  h200)  # the Hopper extend was only ever measured on H100s (stops 52, 53, 55)
    grep -q H200 "$out/gpu_$stage.txt" || { echo "not an H200"; exit 2; }
    timeout 300 python3 -m nanograph bench prefill --models qwen3-0.6b --lengths 256,2048,8192 \
      --out "$out/prefill_06b.json" > "$out/prefill_06b.log" 2>&1
    grep -E "^qwen3-0.6b [a-z_]+:" "$out/prefill_06b.log"
    timeout 200 python3 -m nanograph bench attention --cases \
      extend_1x8192,extend_1x32k,extend_1x8192_06b,extend_1x32k_06b,extend_32x256 \
      --out "$out/attention.json" > "$out/attention.log" 2>&1
    grep -E "^ *extend_" "$out/attention.log" ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
