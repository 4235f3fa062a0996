#!/usr/bin/env bash
# stop 44 call 8: bench decode qwen3-30b-a3b batch 1 on the final tree
set -uo pipefail
out=$(mkdir -p "$1" && cd "$1" && pwd)
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p ~/.triton && tar xzf .triton_cache.tgz -C ~/.triton
timeout 200 python3 -m nanograph bench decode --models qwen3-30b-a3b --batches 1 --arms full \
  --repeats 3 --out "$out/decode_30b.json" > "$out/decode_30b.log" 2>&1
grep -o "decode=full: .*" "$out/decode_30b.log"; tail -2 "$out/decode_30b.log"
