#!/usr/bin/env bash
# stop 43 call 4: decode at batch 8 / 32 / 128 (qwen3-0.6b) and 8 / 32 (qwen3-8b), the tree
# (e697736: 42c35b5's code) against ab/main (fd88f05), alternating: the argmax kernel serves
# every batch size, so no batch may get slower.
set -uo pipefail
out=$(mkdir -p "$1" && cd "$1" && pwd) root=$PWD
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p ~/.triton && tar xzf .triton_cache.tgz -C ~/.triton
dec() {  # dir label model batches rep
  (cd "$1" && PYTHONPATH=$1 timeout 200 python3 -m nanograph bench decode --models "$3" --arms full \
    --batches "$4" --repeats 3 --out "$out/dec_$3_$2_$5.json" > "$out/dec_$3_$2_$5.log" 2>&1)
  echo "dec $3 $2 $5: $(grep -o 'decode=full: .*' "$out/dec_$3_$2_$5.log")"
}
{
for i in 1 2; do
  dec "$root/ab/main" main qwen3-0.6b 8,32,128 $i; dec "$root" new qwen3-0.6b 8,32,128 $i
done
dec "$root/ab/main" main qwen3-8b 8,32 1; dec "$root" new qwen3-8b 8,32 1
} | tee "$out/ab.log"
