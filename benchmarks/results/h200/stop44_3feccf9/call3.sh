#!/usr/bin/env bash
# stop 44 call 3: in-graph tile sweeps: qwen3-30b-a3b's pairwise MoE kernels, qwen3-8b's MLP GEMVs
set -uo pipefail
out=$(mkdir -p "$1" && cd "$1" && pwd)
export PYTHONUNBUFFERED=1
mkdir -p ~/.triton && tar xzf .triton_cache.tgz -C ~/.triton
timeout 280 python3 ab/moe_tiles_sweep.py > "$out/moe_sweep.log" 2>&1; echo "rc=$?" >> "$out/moe_sweep.log"
cat "$out/moe_sweep.log"
timeout 250 python3 ab/gemv_graph_sweep.py > "$out/gemv_sweep.log" 2>&1; echo "rc=$?" >> "$out/gemv_sweep.log"
cat "$out/gemv_sweep.log"
