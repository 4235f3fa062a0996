#!/usr/bin/env bash
# Stop 61: per-kernel time of qwen3-0.6b's and qwen3-8b's batch-2 decode graphs with the fused
# few-row path (rows_norm_fold.patch, FUSED_ROWS=1) and without (0). From the repo root with
# NANOGRAPH_COMMIT exported: bash docs/wip/stop61_breakdown.sh OUT_DIR [0 1]
set -uo pipefail
out=$(mkdir -p "$1" && cd "$1" && pwd); shift
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
git apply docs/wip/rows_norm_fold.patch || exit 2
arms=("$@"); [ ${#arms[@]} -eq 0 ] && arms=(0 1)
for f in "${arms[@]}"; do
  mkdir -p "$out/bd$f"
  BATCH=2 FUSED_ROWS=$f timeout 280 python3 docs/wip/decode_breakdown.py "$out/bd$f" \
    qwen3-0.6b,qwen3-8b > "$out/bd$f/log.txt" 2>&1
  grep -v -i warn "$out/bd$f/log.txt" | grep -v "^INFO" | grep -E "layer|head|kernels a forward"
done
git apply -R docs/wip/rows_norm_fold.patch
