#!/usr/bin/env bash
# stop 44 call 4: a finer in-graph sweep of the pairwise gate/up tiles (qwen3-30b-a3b), then the
# best against main in the engine's decode graph (bench floor), 30b-a3b batch 1 / 8, gpt-oss-20b
set -uo pipefail
out=$(mkdir -p "$1" && cd "$1" && pwd) root=$PWD
export PYTHONUNBUFFERED=1
mkdir -p ~/.triton && tar xzf .triton_cache.tgz -C ~/.triton
timeout 150 python3 ab/moe_tiles_sweep.py > "$out/moe_sweep2.log" 2>&1
cat "$out/moe_sweep2.log"
export NG_GU=$(grep -o 'BEST [0-9,]*' "$out/moe_sweep2.log" | cut -d' ' -f2)
echo "NG_GU=$NG_GU" >> "$out/ab.log"
fl() {  # dir label model batch
  (cd "$1" && PYTHONPATH=$1 timeout 120 python3 -m nanograph bench floor --model "$3" \
    --decode-batch "$4" --lengths 512 --graph full --repeats 20 --out /tmp/f.json > /tmp/f.log 2>&1)
  echo "$3 b$4 $2: $(grep -o 'graph replays alone [0-9.]* ms' /tmp/f.log)" >> "$out/ab.log"
}
for i in 1 2; do fl "$root/ab/main" main qwen3-30b-a3b 1; fl "$root/ab/new" new qwen3-30b-a3b 1; done
fl "$root/ab/main" main qwen3-30b-a3b 8; fl "$root/ab/new" new qwen3-30b-a3b 8
fl "$root/ab/main" main gpt-oss-20b 1; fl "$root/ab/new" new gpt-oss-20b 1
cat "$out/ab.log"
