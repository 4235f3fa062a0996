#!/usr/bin/env bash
# stop 44 call 1: o_early_dependents (new) and o_early + plain gate/up (both) against main on
# the fused qwen3-8b decode graph; the unfused main as the bar; a qwen3-30b-a3b engine trace;
# fused-decode and gemv GPU tests on the new tree.
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
  fl "$root/ab/both" both qwen3-8b always; fl "$root/ab/main" main qwen3-8b auto
done
cat "$out/ab.log"
timeout 240 python3 -m nanograph bench floor --model qwen3-30b-a3b --decode-batch 1 --lengths 512 \
  --graph full --repeats 10 --engine-steps 8 --trace "$out/trace_30b.json" \
  --out "$out/floor_30b.json" > "$out/floor_30b.log" 2>&1
gzip -f "$out/trace_30b.json"; grep -E "graph replays alone|busy" "$out/floor_30b.log" | cut -c1-300
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_fused_decode_gpu.py \
  tests/gpu/test_gemv_gpu.py > "$out/tests.log" 2>&1
tail -1 "$out/tests.log" >> "$out/ab.log"; grep -E "^(FAILED|ERROR)" "$out/tests.log" >> "$out/ab.log"
tail -3 "$out/ab.log"
