#!/usr/bin/env bash
# stop 44 call 7: one-row router tiles (gemv.choose_tiles for products too small for 4-row
# programs) against main (7475f6c): GEMV GPU tests, graph replays of qwen3-30b-a3b / gpt-oss-20b
set -uo pipefail
out=$(mkdir -p "$1" && cd "$1" && pwd) root=$PWD
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p ~/.triton && tar xzf .triton_cache.tgz -C ~/.triton
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gemv_gpu.py -k "float64" > "$out/tests.log" 2>&1
tail -1 "$out/tests.log"; grep -E "^(FAILED|ERROR)" "$out/tests.log"
fl() {  # dir label model batch
  (cd "$1" && PYTHONPATH=$1 timeout 120 python3 -m nanograph bench floor --model "$3" \
    --decode-batch "$4" --lengths 512 --graph full --repeats 20 --out /tmp/f.json > /tmp/f.log 2>&1)
  echo "$3 b$4 $2: $(grep -o 'graph replays alone [0-9.]* ms' /tmp/f.log)" >> "$out/ab.log"
}
for i in 1 2; do fl "$root/ab/main" main qwen3-30b-a3b 1; fl "$root" new qwen3-30b-a3b 1; done
fl "$root/ab/main" main gpt-oss-20b 1; fl "$root" new gpt-oss-20b 1
cat "$out/ab.log"
