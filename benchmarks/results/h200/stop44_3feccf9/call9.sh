#!/usr/bin/env bash
# stop 44 call 9: qwen3-0.6b's fused decode GEMVs swept inside a CUDA graph of 28 layers
set -uo pipefail
out=$(mkdir -p "$1" && cd "$1" && pwd)
export PYTHONUNBUFFERED=1
mkdir -p ~/.triton && tar xzf .triton_cache.tgz -C ~/.triton
timeout 150 python3 ab/fused_chain_sweep.py > "$out/fused_chain_sweep.log" 2>&1; echo "rc=$?" >> "$out/fused_chain_sweep.log"
cat "$out/fused_chain_sweep.log"
