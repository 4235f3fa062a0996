#!/usr/bin/env bash
# Stop 43's first device call: gate_up_prescaled.patch A/B and its GPU tests. Prepare on the
# development machine (ab/ is untracked: it travels with the tree; keep it out of commits):
#   rm -rf ab && mkdir -p ab/main && git archive HEAD nanograph | tar x -C ab/main \
#     && git apply docs/wip/gate_up_prescaled.patch
# (the repo root is then the patched tree, ab/main the base). On the device, from the repo root:
#   NANOGRAPH_COMMIT=<hash>+prescaled bash docs/wip/next_call_prescaled.sh $OUT/r
# Predicted (docs/wip/README.md): qwen3-8b fused (--fused-decode always) 4.10 -> ~3.92 ms, about
# the unfused 3.97; qwen3-0.6b and 30b-a3b (auto = fused) ~1 us a layer less.
set -uo pipefail
out=$(mkdir -p "$1" && cd "$1" && pwd) root=$PWD
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p ~/.triton && tar xzf .triton_cache.tgz -C ~/.triton
fl() {  # dir label model fused rep
  (cd "$1" && PYTHONPATH=$1 timeout 170 python3 -m nanograph bench floor --model "$3" \
    --decode-batch 1 --lengths 512 --graph full --repeats 20 --fused-decode "$4" \
    --out "$out/floor_$3_$2_$4_$5.json" > "$out/floor_$3_$2_$4_$5.log" 2>&1)
  echo "$3 $2 $4 $5: $(grep -o 'graph replays alone [0-9.]* ms' "$out/floor_$3_$2_$4_$5.log")"
}
for i in 1 2; do
  fl "$root/ab/main" main qwen3-8b auto $i; fl "$root/ab/main" main qwen3-8b always $i
  fl "$root" new qwen3-8b always $i
  fl "$root/ab/main" main qwen3-0.6b auto $i; fl "$root" new qwen3-0.6b auto $i
done | tee "$out/floor_ab.log"
fl "$root/ab/main" main qwen3-30b-a3b auto 1 | tee -a "$out/floor_ab.log"
fl "$root" new qwen3-30b-a3b auto 1 | tee -a "$out/floor_ab.log"
G=tests/gpu
timeout 240 python3 -m pytest -q -p no:cacheprovider $G/test_fused_decode_gpu.py \
  $G/test_gemv_gpu.py $G/test_kernels_fused.py > "$out/t0.log" 2>&1 &
timeout 240 python3 -m pytest -q -p no:cacheprovider $G/test_moe_gpu.py $G/test_engine_gpu.py \
  > "$out/t1.log" 2>&1 &
wait
for i in 0 1; do tail -1 "$out/t$i.log"; grep -E "^(FAILED|ERROR)" "$out/t$i.log" | head; done
