#!/usr/bin/env bash
# stop 43 call 6: the fused layer's gate/up without the SiLU epilogue (the down GEMV takes the
# activation on load, as the unfused MLP does), against ab/main (966f6ac). Graph replayed alone.
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
fl "$root/ab/main" main qwen3-8b always; fl "$root" new qwen3-8b always
fl "$root/ab/main" main qwen3-8b auto
fl "$root/ab/main" main qwen3-0.6b auto; fl "$root" new qwen3-0.6b auto
fl "$root/ab/main" main qwen3-30b-a3b auto; fl "$root" new qwen3-30b-a3b auto
fl "$root" new qwen3-8b always; fl "$root/ab/main" main qwen3-0.6b auto; fl "$root" new qwen3-0.6b auto
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_fused_decode_gpu.py \
  tests/gpu/test_moe_gpu.py -k fused > "$out/tests.log" 2>&1
tail -1 "$out/tests.log" >> "$out/ab.log"; grep -E "^(FAILED|ERROR)" "$out/tests.log" >> "$out/ab.log"
cat "$out/ab.log"
