#!/usr/bin/env bash
# One device call (~7 min) for docs/wip/lazy_rescale_new_keys.patch (stop 45, not measured):
# the long-prompt new-key loop rescales acc and l_i only when a block raises a row's max by
# more than 8 (log2 units). Prepare on the development machine (ab/ is untracked: it travels
# with the tree, keep it out of commits):
#   rm -rf ab && mkdir -p ab/main && git archive HEAD nanograph | tar x -C ab/main \
#     && git apply docs/wip/lazy_rescale_new_keys.patch
# On the device, from the repo root, NANOGRAPH_COMMIT exported, the Triton cache unpacked:
#   bash docs/wip/lazy_rescale_call.sh $OUT/r
# Predicted: bench attention 1 x 8192, qwen3-0.6b heads 0.603 -> ~0.56 ms (the loop skips
# 64 of its ~250 non-MMA instructions a thread a block in most blocks); qwen3-0.6b's 8k
# prefill back to back 32.2 -> ~31.0 ms. The tile-wide decision is a cross-warp max a block:
# if that costs a barrier the loop did not have, the gain can vanish. With Triton 3.9 the
# loop's BAR.SYNC count did not change; with the device's 3.6 (stop 46) it does: 3 -> 4 a
# block, beside 2 STS + 2 LDS and 5 more SHFL, for 368 -> 288 instructions on the common path.
set -uo pipefail
out=$(mkdir -p "$1" && cd "$1" && pwd)
root=$PWD
[ -d ab/main/nanograph ] || { echo "prepare ab/main first (see the top of this file)" >&2; exit 2; }
in_tree() { local d=$1; shift; (cd "$d" && PYTHONPATH=$d "$@"); }
in_tree "$root" timeout 240 python3 -m pytest -q -p no:cacheprovider -rfE \
  tests/gpu/test_kernels_attention.py > "$out/tests.log" 2>&1
tail -n 3 "$out/tests.log"
cases=extend_1x8192_06b,extend_1x8192,extend_1x32k_06b,extend_32x256
for t in main patch; do
  d=$root/ab/main; [ $t = patch ] && d=$root
  in_tree "$d" timeout 150 python3 -m nanograph bench attention --cases $cases \
    --out "$out/attention_$t.json" 2>&1 | grep -E "^extend" | sed "s/^/$t /"
done
for i in 1 2; do for t in main patch; do
  d=$root/ab/main; [ $t = patch ] && d=$root
  in_tree "$d" timeout 120 python3 -m nanograph bench prefill --models qwen3-0.6b \
    --lengths 2048,8192 --arms full --peer-lengths= --repeats 10 \
    --out "$out/prefill_${t}_$i.json" 2>&1 | grep -E "full:|MHz" | sed "s/^/$t $i /"
done; done
