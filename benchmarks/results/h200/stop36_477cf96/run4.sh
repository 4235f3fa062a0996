#!/usr/bin/env bash
# call 4: which of 1ab02c9 / 7736971 moved qwen3-30b-a3b's decode graph replay (2.405 -> 2.549 ms)
set -uo pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
root=$PWD; o=$1; mkdir -p $o
for t in c88 1ab 773; do cp nanograph/bench/floor.py ab/$t/nanograph/bench/floor.py; done
for i in 1 2; do for t in c88 1ab 773; do d=$root/ab/$t
  for m in qwen3-30b-a3b; do
  (cd $d && PYTHONPATH=$d timeout 90 python3 -m nanograph bench floor --model $m --decode-batch 1 --lengths 512 --graph full --repeats 50 --out $o/floor_${m}_${t}_$i.json 2>&1 | grep -v "^INFO" > $o/floor_${m}_${t}_$i.log)
  echo "$m $t $i: $(grep -o 'graph replays alone [0-9.]* ms' $o/floor_${m}_${t}_$i.log)"
  done
done; done
