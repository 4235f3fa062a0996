#!/bin/bash
# scratch: first device call of stop 35
set -x
export PYTHONPATH=$PWD NANOGRAPH_COMMIT=${NANOGRAPH_COMMIT:-ae71bde}
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/device.txt
# 1. the two GPU tests 1d8b5cb left unrun
timeout 200 python3 -m pytest -q -x tests/gpu/test_fused_decode_gpu.py -k "test_decode_fused_matches_unfused or three_kernels" > $R/t_fused.log 2>&1
tail -3 $R/t_fused.log
# 2. in-graph A/B of the one-row split policy on qwen3-0.6b
for round in 1 2; do
  for v in base m8 m4 m2; do
    if [ $v = base ]; then d=$PWD; else d=$PWD/ab_$v; fi
    (cd $d && PYTHONPATH=$d timeout 120 python3 -m nanograph bench floor --model qwen3-0.6b --decode-batch 1 --lengths 512 --graph full --repeats 20 --out $R/f06_${v}_$round.json > $R/f06_${v}_$round.log 2>&1)
    grep -h "graph replays alone\|busy" $R/f06_${v}_$round.log | cut -c1-300
  done
done
# 3. isolated sweep of the one-row decode (last: its deadline cuts it)
timeout 240 python3 -m nanograph bench attention --cases decode_1x512_06b,decode_1x512_30b,decode_1x4k_30b --rep-ms 100 --sweep --sweep-seconds 150 --out $R/attn_sweep.json > $R/attn_sweep.log 2>&1
tail -8 $R/attn_sweep.log
cd $OUT && tar czf results.tgz r
cd ~/.triton && tar czf $OUT/triton_cache.tgz --exclude='*.llir' --exclude='*.ttir' --exclude='*.ttgir' --exclude='*.ptx' --exclude='*.source' cache
