#!/usr/bin/env bash
# stop 44 call 6: in-graph sweep of qwen3-30b-a3b's router GEMV tiles and (with the new gate/up
# default) the pairwise down's
set -uo pipefail
out=$(mkdir -p "$1" && cd "$1" && pwd)
export PYTHONUNBUFFERED=1
mkdir -p ~/.triton && tar xzf .triton_cache.tgz -C ~/.triton
timeout 200 python3 ab/moe_router_sweep.py > "$out/router_sweep.log" 2>&1; echo "rc=$?" >> "$out/router_sweep.log"
cat "$out/router_sweep.log"
