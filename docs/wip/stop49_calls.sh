#!/usr/bin/env bash
# Stop 49's device calls, run back to back (the machine goes after 30 s idle). From the repo
# root with NANOGRAPH_COMMIT exported:
#   bash docs/wip/stop49_calls.sh tests $OUT/r   # ~6 min: all of test_moe_gpu.py (a842ecf and
#     f74203f never ran there), dense gpt-oss-20b under tc_piecewise (bench coverage)
#   bash docs/wip/stop49_calls.sh moe_bf16 $OUT/r    # ~8 min: moe_prefill_sweep.py, bf16 cases
#   bash docs/wip/stop49_calls.sh moe_mxfp4 $OUT/r   # ~8 min: the MXFP4 case (dot_scaled too)
#   bash docs/wip/stop49_calls.sh moe_tests $OUT/r   # ~6 min: test_moe_gpu.py, gpt-oss-20b prefill
#     against main (docs/wip/act_apart.patch: this stop's change, taken off a copy of the tree)
#   bash docs/wip/stop49_calls.sh moe_prefill $OUT/r # ~6 min: gpt-oss-20b MXFP4, qwen3-30b-a3b
#   bash docs/wip/stop49_calls.sh oss120 $OUT/r  # ~5 min, H200 only: gpt-oss-120b prefill over eager
# The sweeps (moe_bf16, moe_mxfp4) apply moe_prefill.patch, which fits ee1fb97 only: main has
# the activation pass it prototyped (a015a3c). moe_all ran the tests before the pairs.
set -uo pipefail
stage=$1 out=$(mkdir -p "$2" && cd "$2" && pwd)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv > "$out/gpu_$stage.txt"
# a sweep's patch left by an earlier call (not `git checkout`: the device's .git is the last
# landed commit, so that would also take off this tree's own changes, as it did in stop 49)
git apply --check -R docs/wip/moe_prefill.patch 2>/dev/null && git apply -R docs/wip/moe_prefill.patch
sweep() {
  git apply docs/wip/moe_prefill.patch || exit 2
  timeout 560 python3 docs/wip/moe_prefill_sweep.py --cases "$1" --out "$out/moe_$stage.json" 2>&1 \
    | grep -v -i warn | tee "$out/moe_$stage.log" | grep -E "^[a-z]|default"
  git apply -R docs/wip/moe_prefill.patch
}
prefill_pair() {  # MODEL NAME [FLAGS]: bench prefill on this tree, then on main (ee1fb97)
  local model=$1 name=$2; shift 2
  [ -d /tmp/base ] || { cp -r "$PWD" /tmp/base && git -C /tmp/base apply -R docs/wip/act_apart.patch; }
  for tree in "$PWD" /tmp/base; do
    tag=$([ "$tree" = "$PWD" ] && echo new || echo main)
    (cd "$tree" && PYTHONPATH=$tree timeout 200 python3 -m nanograph bench prefill --models "$model" \
      --arms full --lengths 256,2048,8192 --peer-lengths '' "$@" \
      --out "$out/prefill_${model}_${name}_$tag.json" > "$out/prefill_${model}_${name}_$tag.log" 2>&1)
    echo "$tag"; grep -E "full:|SM clock" "$out/prefill_${model}_${name}_$tag.log"
  done
}
case $stage in
  tests)
    timeout 330 python3 -m pytest -q -p no:cacheprovider -rfE tests/gpu/test_moe_gpu.py \
      > "$out/test_moe_gpu.log" 2>&1; tail -n 4 "$out/test_moe_gpu.log"
    timeout 200 python3 -m nanograph bench coverage --models gpt-oss-20b --moe-backends triton \
      --backends tc_piecewise --out "$out/coverage_dense_tc.json" > "$out/coverage_dense_tc.log" 2>&1
    tail -n 6 "$out/coverage_dense_tc.log" ;;
  moe_bf16) sweep gpt-oss-20b:bf16,qwen3-30b-a3b:bf16 ;;
  moe_mxfp4) sweep gpt-oss-20b:mxfp4 ;;
  moe_tests)  # the activation pass and the large sorted tiles, then gpt-oss-20b prefill in bf16
    timeout 300 python3 -m pytest -q -p no:cacheprovider -rfE tests/gpu/test_moe_gpu.py \
      > "$out/test_moe_gpu.log" 2>&1; tail -n 3 "$out/test_moe_gpu.log"
    prefill_pair gpt-oss-20b bf16 ;;
  moe_prefill)
    prefill_pair gpt-oss-20b mxfp4 --quantization mxfp4
    prefill_pair qwen3-30b-a3b bf16 ;;
  moe_all)  # what fits one call: tests, then each pair while under ~7 minutes
    timeout 240 python3 -m pytest -q -p no:cacheprovider -rfE tests/gpu/test_moe_gpu.py \
      > "$out/test_moe_gpu.log" 2>&1; tail -n 3 "$out/test_moe_gpu.log"
    prefill_pair gpt-oss-20b bf16
    [ $SECONDS -lt 380 ] && prefill_pair gpt-oss-20b mxfp4 --quantization mxfp4
    [ $SECONDS -lt 420 ] && prefill_pair qwen3-30b-a3b bf16 ;;
  oss120)
    timeout 500 python3 -m nanograph bench prefill --models gpt-oss-120b --arms full,eager \
      --lengths 2048,8192 --quantization mxfp4 --peer-lengths '' \
      --out "$out/prefill_120b.json" > "$out/prefill_120b.log" 2>&1
    tail -n 8 "$out/prefill_120b.log" ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
