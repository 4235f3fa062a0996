#!/usr/bin/env bash
# stop 43 call 5: where the fused qwen3-8b layer loses its 0.14 ms, kernel by kernel: the
# engine's decode steps under the profiler with traces, fused (always) and unfused (auto).
set -uo pipefail
out=$(mkdir -p "$1" && cd "$1" && pwd)
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p ~/.triton && tar xzf .triton_cache.tgz -C ~/.triton
for mode in auto always; do
  timeout 240 python3 -m nanograph bench floor --model qwen3-8b --decode-batch 1 --lengths 512 \
    --graph full --repeats 10 --engine-steps 8 --fused-decode $mode --trace "$out/trace_$mode.json" \
    --out "$out/floor_$mode.json" > "$out/floor_$mode.log" 2>&1
  gzip -f "$out/trace_$mode.json"
  grep -E "graph replays alone|busy" "$out/floor_$mode.log" | cut -c1-300
done
