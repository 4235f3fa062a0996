#!/usr/bin/env bash
# The next session's first device call: o_early_dependents.patch A/B (the fused layer's o GEMV
# letting gate/up launch right after its wait, at hidden > 2048; docs/wip/README.md says why).
# Prepare on the development machine (ab/ is untracked: it travels with the tree; keep it out
# of commits):
#   rm -rf ab && mkdir -p ab/main && git archive HEAD nanograph | tar x -C ab/main \
#     && git apply docs/wip/o_early_dependents.patch
# On the device, from the repo root:
#   NANOGRAPH_COMMIT=<hash>+o_early bash docs/wip/next_call_o_early.sh $OUT
# Predicted: qwen3-8b fused (--fused-decode always) 4.066 -> ~3.90 ms if the launch timing is
# what the unfused path's add_rmsnorm gives gate/up (stop 43, call 5: fused gate/up 55.3
# against 48.8 us a layer); the unfused 3.927 is the bar. qwen3-0.6b / 30b-a3b: unchanged
# (hidden <= 2048 keeps the late trigger).
set -uo pipefail
out=$(mkdir -p "$1" && cd "$1" && pwd) root=$PWD
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p ~/.triton && tar xzf .triton_cache.tgz -C ~/.triton
fl() {  # dir label model fused
  (cd "$1" && PYTHONPATH=$1 timeout 100 python3 -m nanograph bench floor --model "$3" \
    --decode-batch 1 --lengths 512 --graph full --repeats 20 --fused-decode "$4" \
    --out /tmp/f.json > /tmp/f.log 2>&1)
  echo "$3 $2 $4: $(grep -o 'graph replays alone [0-9.]* ms' /tmp/f.log)" >> "$out/ab.log"
}
for i in 1 2; do
  fl "$root/ab/main" main qwen3-8b always; fl "$root" new qwen3-8b always
  fl "$root/ab/main" main qwen3-8b auto
done
fl "$root/ab/main" main qwen3-0.6b auto; fl "$root" new qwen3-0.6b auto
# the fused gate/up's tiles, isolated (docs/wip/gate_up_sweep.py)
PYTHONPATH=$root timeout 120 python3 docs/wip/gate_up_sweep.py > "$out/sweep.log" 2>&1
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_fused_decode_gpu.py \
  tests/gpu/test_gemv_gpu.py > "$out/tests.log" 2>&1
tail -1 "$out/tests.log" >> "$out/ab.log"; grep -E "^(FAILED|ERROR)" "$out/tests.log" >> "$out/ab.log"
cat "$out/ab.log"
