#!/bin/bash
# scratch: second device call of stop 35 (tree = one-row attention takes the new key from registers)
export NANOGRAPH_COMMIT=${NANOGRAPH_COMMIT:-ae71bde+v2}
mkdir -p ~/.triton && tar xzf .triton_cache.tgz -C ~/.triton
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/device.txt
export PYTHONPATH=$PWD
# GPU tests of the one-row path (four processes)
timeout 230 python3 -m pytest -q tests/gpu/test_kernels_attention.py > $R/t_attn.log 2>&1 &
timeout 230 python3 -m pytest -q tests/gpu/test_fused_decode_gpu.py > $R/t_fused.log 2>&1 &
timeout 230 python3 -m pytest -q tests/gpu/test_spec_gpu.py > $R/t_spec.log 2>&1 &
timeout 230 python3 -m pytest -q tests/gpu/test_moe_gpu.py > $R/t_moe.log 2>&1 &
wait
for f in $R/t_*.log; do echo "$f: $(tail -1 $f)"; done
for round in 1 2; do
  for v in base v1 tree v12; do
    [ $SECONDS -gt 500 ] && break 2
    if [ $v = tree ]; then d=$PWD; else d=$PWD/ab_$v; fi
    (cd $d && PYTHONPATH=$d timeout 100 python3 -m nanograph bench floor --model qwen3-0.6b --decode-batch 1 --lengths 512 --graph full --repeats 20 --out $R/f06_${v}_$round.json > $R/f06_${v}_$round.log 2>&1)
    echo "$v $round: $(grep -h 'graph replays alone' $R/f06_${v}_$round.log | grep -o 'graph replays alone [0-9.]* ms') $(grep -h 'busy' $R/f06_${v}_$round.log | grep -o '_paged_attention_kernel [0-9.]*' | head -1) $(grep -h 'busy' $R/f06_${v}_$round.log | grep -o '_gemv_kernel [0-9.]*' | head -1)"
  done
done
cd $OUT && tar czf results.tgz r && rm -rf r/*.json r/f06*.log
cd ~/.triton && tar czf $OUT/triton_cache.tgz --exclude='*.llir' --exclude='*.ttir' --exclude='*.ttgir' --exclude='*.ptx' --exclude='*.source' cache
