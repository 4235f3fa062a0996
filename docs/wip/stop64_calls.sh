#!/usr/bin/env bash
# Stop 64's device calls, from the repo root with NANOGRAPH_COMMIT exported:
#   bash docs/wip/stop64_calls.sh tests $OUT/t      # ~5 min: stop63_calls.sh's (tests/gpu but
#                                                  # TP and the kernel files)
#   bash docs/wip/stop64_calls.sh native_ab $OUT/n  # ~5 min: the native MoE's breakable prefill
#                                                  # over eager, without and with the slim break
#   MODELS=qwen3-30b-a3b MOE=torch_native bash docs/wip/stop64_calls.sh coverage $OUT/v
#                                                  # ~4 min a model and MoE backend (qwen3-8b:
#                                                  # MOE=triton): the prefill column with
#                                                  # 485d7e9's prefix cache off
#   bash docs/wip/stop64_calls.sh views_ab $OUT/w    # ~6 min: native_expert_views.patch's
#                                                  # tests, then its A/B as native_ab's
#   bash docs/wip/stop64_calls.sh first $OUT/f     # the first call, whichever GPU comes:
#                                                  # aims on an H200, views_ab on an H100
#   spec_cold, aims: stop63_calls.sh's
# PREDICTED for views_ab: the per-expert weight views kept a layer (two unbinds of 128 views a
# layer fewer: 0.23 ms of a 5.4 ms break on the CPU machine, ~0.1 ms on the device's host)
# take ~5 ms off both arms of qwen3-30b-a3b at 256 tokens: paired 1.40x -> ~1.44x;
# gpt-oss-20b (32 experts) ~+1%.
# PREDICTED for coverage: the graph arms' prefill speedups at 255 tokens like bench prefill's
# at 256 (qwen3-30b-a3b torch_native breakable ~1.4x; triton full ~1.0-1.3x: GPU-bound), each
# prefill cell now with more replays than its mixed batch's one.
# PREDICTED for native_ab (qwen3-30b-a3b, 256 tokens; stop 62: eager 145.9 ms, breakable
# 101.0): the slim break (native_break_slim.patch: the sort before the per-expert loop and
# the combine after it in the graph, ~12 launches a layer fewer in the break, bincount's
# host read gone) takes ~3-6 ms off breakable and ~1 ms off eager (one sync a layer fewer):
# the paired ratio 1.44x -> ~1.47-1.50x; gpt-oss-20b (GPU-bound experts) ~level.
set -uo pipefail
stage=$1 out=$(mkdir -p "$2" && cd "$2" && pwd)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
# breakable prefill at 256 tokens beside its own engine's eager, paired: $1 label, $2 models
arm() {
  timeout 200 python3 -m nanograph bench prefill --models "$2" --lengths 256 \
    --arms breakable --moe-backend torch_native --peer-lengths '' --repeats 15 \
    --eager-beside --out "$out/native_$1.json" > "$out/native_$1.log" 2>&1
  echo "== $1 rc=$?"; grep -E "breakable: |paired" "$out/native_$1.log"
}
case $stage in
  first)
    if grep -q H200 "$out/gpu.txt"; then exec bash "$0" aims "$out"; fi
    exec bash "$0" views_ab "$out" ;;
  tests|spec_cold|cold|aims|tests_core) exec bash docs/wip/stop63_calls.sh "$stage" "$out" ;;
  coverage)
    timeout 560 python3 -m nanograph bench coverage --models "${MODELS:?}" \
      --moe-backends "${MOE:-triton}" --out "$out/coverage.json" > "$out/coverage.log" 2>&1
    echo "rc=$?"; grep -v -i "warn\|^INFO" "$out/coverage.log" | tail -14 ;;
  views_ab)  # the patch's GPU tests, then without (HEAD) / with it, alternating, paired
    git apply docs/wip/native_expert_views.patch
    timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE tests/gpu/test_moe_gpu.py \
      -k "native or breakable or piecewise" > "$out/views_tests.log" 2>&1
    tail -n 1 "$out/views_tests.log"
    for round in 1 2; do
      for tree in views head; do
        [ $tree = head ] && git apply -R docs/wip/native_expert_views.patch
        arm "$tree$round" qwen3-30b-a3b,gpt-oss-20b
        [ $tree = head ] && git apply docs/wip/native_expert_views.patch
      done
    done
    git apply -R docs/wip/native_expert_views.patch ;;
  native_ab|native_ab2)
    if [ "$stage" = native_ab2 ]; then  # gpt-oss-20b again, slim first (the first run's
      # slim arm came last, after its before arm's samples had drifted up 40%)
      for round in 1 2; do
        arm "slim_oss$round" gpt-oss-20b
        git apply -R docs/wip/native_break_slim.patch && arm "before_oss$round" gpt-oss-20b
        git apply docs/wip/native_break_slim.patch
      done
      arm slim3 qwen3-30b-a3b
      git apply -R docs/wip/native_break_slim.patch && arm before3 qwen3-30b-a3b
      git apply docs/wip/native_break_slim.patch; exit 0
    fi
    # the tree holds the slim break; before = the patch reversed (restored after)
    for round in 1 2; do
      git apply -R docs/wip/native_break_slim.patch && arm "before$round" qwen3-30b-a3b
      git apply docs/wip/native_break_slim.patch && arm "slim$round" qwen3-30b-a3b
    done
    git apply -R docs/wip/native_break_slim.patch && arm before_oss gpt-oss-20b
    git apply docs/wip/native_break_slim.patch && arm slim_oss gpt-oss-20b ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
