#!/usr/bin/env bash
# call 3: (a) 30b-a3b graph replay HEAD vs c8839da, (b) token copy stream decode A/B, (c) bench gemv rows
# (ab/old: `git archive c8839da nanograph`; ab/tok: HEAD's nanograph + docs/wip/token_copy_stream.patch)
set -uo pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
root=$PWD; o=$1; mkdir -p $o
cp nanograph/bench/floor.py ab/old/nanograph/bench/floor.py
for i in 1 2; do for t in new old; do d=$root; [ $t = old ] && d=$root/ab/old
  (cd $d && PYTHONPATH=$d timeout 110 python3 -m nanograph bench floor --model qwen3-30b-a3b --decode-batch 1 --lengths 512 --graph full --repeats 20 --out $o/floor30_${t}_$i.json 2>&1 | grep -v "^INFO" > $o/floor30_${t}_$i.log)
  echo "30b $t $i: $(grep -o 'graph replays alone [0-9.]* ms' $o/floor30_${t}_$i.log)"
done; done
for i in 1 2; do for t in new tok; do d=$root; [ $t = tok ] && d=$root/ab/tok
  (cd $d && PYTHONPATH=$d timeout 90 python3 -m nanograph bench decode --models qwen3-0.6b --arms full --batches 1,8 --repeats 5 --out $o/dec_${t}_$i.json 2>&1 | grep -v "^INFO" > $o/dec_${t}_$i.log)
  echo "decode $t $i: $(grep 'decode=full' $o/dec_${t}_$i.log)"
done; done
PYTHONPATH=$root timeout 150 python3 -m nanograph bench gemv --models qwen3-8b --rows 5,8,16 --blas cublas,cublaslt --out $o/gemv_rows_8b.json > $o/gemv_rows_8b.log 2>&1
grep -v "^INFO" $o/gemv_rows_8b.log | tail -30
