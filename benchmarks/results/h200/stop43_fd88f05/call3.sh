#!/usr/bin/env bash
# stop 43 call 3: decode A/B at batch 1 (qwen3-0.6b, qwen3-8b, qwen3-30b-a3b) and the LM head
# GEMV's tiles, the tree against ab/main (fd88f05), alternating.
set -uo pipefail
out=$(mkdir -p "$1" && cd "$1" && pwd) root=$PWD
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p ~/.triton && tar xzf .triton_cache.tgz -C ~/.triton
dec() {  # dir label model rep
  (cd "$1" && PYTHONPATH=$1 timeout 200 python3 -m nanograph bench decode --models "$3" --arms full \
    --batches 1 --repeats 3 --out "$out/dec_$3_$2_$4.json" > "$out/dec_$3_$2_$4.log" 2>&1)
  echo "dec $3 $2 $4: $(grep -o 'decode=full: .*' "$out/dec_$3_$2_$4.log")"
}
gv() {
  (cd "$1" && PYTHONPATH=$1 timeout 200 python3 -m nanograph bench gemv --models qwen3-8b,qwen3-0.6b \
    --out "$out/gemv_$2.json" > "$out/gemv_$2.log" 2>&1)
  echo "gemv $2: $(grep lm_head "$out/gemv_$2.log" | tr -s ' ' | cut -c1-200)"
}
{
for i in 3 4; do dec "$root/ab/main" main qwen3-0.6b $i; dec "$root" new qwen3-0.6b $i; done
for i in 1 2; do dec "$root/ab/main" main qwen3-8b $i; dec "$root" new qwen3-8b $i; done
dec "$root/ab/main" main qwen3-30b-a3b 1; dec "$root" new qwen3-30b-a3b 1
gv "$root/ab/main" main; gv "$root" new
} | tee "$out/ab.log"
