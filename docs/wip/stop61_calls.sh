#!/usr/bin/env bash
# Stop 61's device calls, from the repo root with NANOGRAPH_COMMIT exported:
#   bash docs/wip/stop61_calls.sh tests $OUT/t    # ~6 min: tests/gpu but TP (five processes)
#   bash docs/wip/stop61_calls.sh decode $OUT/d   # ~4 min: bench decode full vs full:unfused
#   bash docs/wip/stop61_calls.sh spec $OUT/s     # ~4 min: bench spec, 8b target, 0.6b drafter
#   bash docs/wip/stop61_calls.sh compiles $OUT/c # ~5 min: Triton compiles inside captures
#   bash docs/wip/stop61_calls.sh chain $OUT/f    # ~1 min: rows_norm_chain_probe.py
# PREDICTED for decode (H100): the fused few-row layers (on by default since stop 61) +6-11%
# tok/s on qwen3-0.6b at batch 2-8, qwen3-8b level to +1%; batch 1 unchanged.
set -uo pipefail
stage=$1 out=$(mkdir -p "$2" && cd "$2" && pwd)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv > "$out/gpu_$stage.txt"
case $stage in
  tests)
    bash benchmarks/run_device.sh tests-parallel "$out" | grep -v "^name\|HBM" ;;
  decode)
    timeout 500 python3 -m nanograph bench decode --models qwen3-0.6b,qwen3-8b \
      --arms full,full:unfused --batches 1,2,4,8 --new-tokens 128 --repeats 3 \
      --out "$out/decode_rows.json" > "$out/decode_rows.log" 2>&1
    grep -E "decode=|roofline|kernels" "$out/decode_rows.log" | tail -24 ;;
  spec)
    timeout 500 python3 -m nanograph bench spec --target qwen3-8b --drafter qwen3-0.6b \
      --arms off,ngram:4,draft:4 --batches 1,4 --new-tokens 64 --repeats 3 \
      --out "$out/spec_8b.json" > "$out/spec_8b.log" 2>&1
    grep -v -i "warn\|^INFO" "$out/spec_8b.log" | tail -30 ;;
  chain)
    timeout 400 python3 docs/wip/rows_norm_chain_probe.py qwen3-0.6b,qwen3-8b 2,4,8 \
      > "$out/chain.log" 2>&1; grep rows "$out/chain.log" ;;
  compiles)
    timeout 560 python3 docs/wip/capture_compiles_probe.py > "$out/compiles.log" 2>&1
    grep -v Warning "$out/compiles.log" | tail -40 ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
