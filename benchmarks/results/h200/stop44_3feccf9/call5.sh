#!/usr/bin/env bash
# stop 44 call 5: the pairwise gate/up tiles (main + the change) against main: GPU MoE tests,
# then bench decode qwen3-30b-a3b batch 1 / 8 alternating with main
set -uo pipefail
out=$(mkdir -p "$1" && cd "$1" && pwd) root=$PWD
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p ~/.triton && tar xzf .triton_cache.tgz -C ~/.triton
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_moe_gpu.py > "$out/tests.log" 2>&1
tail -1 "$out/tests.log"; grep -E "^(FAILED|ERROR)" "$out/tests.log"
dec() {  # dir label
  (cd "$1" && PYTHONPATH=$1 timeout 150 python3 -m nanograph bench decode --models qwen3-30b-a3b \
    --batches 1,8 --arms full --repeats 3 --out "$out/decode_$2_$3.json" > "$out/decode_$2_$3.log" 2>&1)
  echo "dec $2 $3: $(grep -o "decode=full: .*" "$out/decode_$2_$3.log" | tr "\n" " ")"
}
dec "$root/ab/main" main 1; dec "$root" new 1; dec "$root/ab/main" main 2; dec "$root" new 2
