#!/usr/bin/env bash
# For the next device session. Stop 55 landed the three host-cost patches its stop55_calls.sh
# measured (benchmarks/results/h100/stop55_8962cf1/COMMAND.md) and left three patches, CPU-tested
# only. Apply all three here before the first call, so the tree sent holds them:
#   git apply docs/wip/lean_launch.patch docs/wip/draft_advance.patch \
#     docs/wip/native_pretransposed.patch
# (and `git apply -R` the same after the session, or land what measured). Each A/B stage
# reverses its own patch for its "before" arm and applies it again. From the repo root with
# NANOGRAPH_COMMIT exported, most important first:
#   bash docs/wip/stop56_calls.sh tests $OUT/t      # ~6 min: every tests/gpu file but TP with
#     the three patches (also the first GPU run of 4660053's live-range test fix)
#   bash docs/wip/stop56_calls.sh lean_ab $OUT/l    # ~4 min: bench host, breakable and eager
#     prefill of qwen3-0.6b at 256 and 2048 tokens, with Triton 3.6's C launcher called
#     directly (lean_launch.patch) and without, alternating
#   bash docs/wip/stop56_calls.sh draft_ab $OUT/d   # ~4 min: issue 16's draft loop over k
#     drafter steps (device time) with the one-launch input advance and without
#   bash docs/wip/stop56_calls.sh native_ab $OUT/n  # ~5 min (RUNS=2): issue 15's native-MoE
#     ratio with the experts' weights pre-transposed and without, alternating
#   bash docs/wip/stop56_calls.sh h200 $OUT/h       # ~8 min, on an H200 only: issue 18's
#     figures there with the Hopper extend (0.6b prefill, every arm and the peer; attention)
# PREDICTED (stop 55's H100: breakable 2.41 / full 2.08 ms at 256 tokens; attention was ~73%
# of breakable's profiled Python, Triton's runner and descriptor encoding ~40% of that):
# lean: breakable at 256 ~2.15-2.25 ms, eager 9.8 -> ~8.5-9; draft: the loop 1.08x ->
# ~1.065x k drafter steps; native: qwen3-30b-a3b 1.23x -> ~1.28-1.30x, gpt-oss-20b ~1.22x.
set -uo pipefail
stage=$1 out=$(mkdir -p "$2" && cd "$2" && pwd)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv > "$out/gpu_$stage.txt"
# $1: a patch; runs the rest of the line with it reversed, then applies it again
without() {
  local patch=$1
  shift
  git apply -R "$patch" || exit 2
  "$@"
  git apply "$patch" || exit 2
}
host() {  # $1: a name for the files
  for t in 256 2048; do
    timeout 120 python3 -m nanograph bench host --model qwen3-0.6b --workload prefill \
      --tokens $t --arms breakable,eager --repeats 30 --top 30 --out "$out/host_${t}_$1.json" \
      > "$out/host_${t}_$1.log" 2>&1
    echo "$1 $t: $(grep '^==.*per call' "$out/host_${t}_$1.log" | tr '\n' ' ')"
  done
}
spec() {  # $1: a name for the files
  timeout 250 python3 -m nanograph bench spec --target qwen3-0.6b --drafter qwen3-0.6b \
    --arms self:4 --batches 1,4 --new-tokens 64 --repeats 3 \
    --out "$out/spec_$1.json" > "$out/spec_$1.log" 2>&1
  echo "== $1"; grep -E "batch [0-9]+:" "$out/spec_$1.log" \
    | grep -oE "batch [0-9]+|'draft_loop[a-z_]*': [0-9.]+|'drafter_decode': [0-9.]+"
}
native() {  # $1: a name for the files
  timeout 170 python3 -m nanograph bench prefill --models gpt-oss-20b,qwen3-30b-a3b \
    --lengths 256 --arms eager,breakable --moe-backend torch_native --peer-lengths '' \
    --repeats 15 --out "$out/native_$1.json" 2>&1 | grep -v "^INFO" > "$out/native_$1.log"
  echo "== $1"; grep -A2 "speedup over eager" "$out/native_$1.log"
}
case $stage in
  tests)
    bash benchmarks/run_device.sh tests-parallel "$out" ;;
  lean_ab)  # RUNS=1: one pair
    for i in $(seq "${RUNS:-2}"); do
      host "lean_$i"
      without docs/wip/lean_launch.patch host "runner_$i"
    done ;;
  draft_ab)
    spec after
    without docs/wip/draft_advance.patch spec before ;;
  native_ab)
    for i in $(seq "${RUNS:-2}"); do
      native "after_$i"
      without docs/wip/native_pretransposed.patch native "before_$i"
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
