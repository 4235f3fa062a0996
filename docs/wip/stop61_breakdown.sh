#!/usr/bin/env bash
# Stop 61: per-kernel time and back-to-back graph replay of decode graphs with the fused
# few-row layers off (FUSED_ROWS=0) and on (1), alternating. From the repo root with
# NANOGRAPH_COMMIT exported: bash docs/wip/stop61_breakdown.sh OUT_DIR MODELS BATCHES
# (stop 61 ran it at 352adf9 with rows_norm_fold.patch applied, and again at f27e490 where it
# had landed: bash docs/wip/stop61_breakdown.sh $OUT/bd qwen3-0.6b 2,4,8)
set -uo pipefail
out=$(mkdir -p "$1" && cd "$1" && pwd)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
for b in ${3//,/ }; do
  for f in 0 1 0 1; do
    d="$out/b${b}_f$f"; mkdir -p "$d"
    BATCH=$b FUSED_ROWS=$f timeout 200 python3 docs/wip/decode_breakdown.py "$d" "$2" \
      >> "$d/log.txt" 2>&1; rm -f "$d"/trace_*.json
    echo "batch $b fused_rows=$f: $(grep -E 'kernels a forward' "$d/log.txt" | tail -1)"
  done
done
