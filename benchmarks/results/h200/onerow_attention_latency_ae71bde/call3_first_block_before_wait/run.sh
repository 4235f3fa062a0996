#!/bin/bash
# scratch: third device call of stop 35 (tree = one-row attention loads its first key block before the PDL wait)
export NANOGRAPH_COMMIT=${NANOGRAPH_COMMIT:-ae71bde+v3}
mkdir -p ~/.triton && tar xzf .triton_cache.tgz -C ~/.triton
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/device.txt
export PYTHONPATH=$PWD
timeout 200 python3 -m pytest -q tests/gpu/test_kernels_attention.py > $R/t_attn.log 2>&1 &
timeout 200 python3 -m pytest -q tests/gpu/test_fused_decode_gpu.py > $R/t_fused.log 2>&1 &
timeout 200 python3 -m pytest -q tests/gpu/test_spec_gpu.py > $R/t_spec.log 2>&1 &
timeout 200 python3 -m pytest -q tests/gpu/test_moe_gpu.py > $R/t_moe.log 2>&1 &
wait
for f in $R/t_*.log; do echo "$f: $(tail -1 $f)"; done
run() {  # variant model extra-args tag
  if [ $1 = tree ]; then d=$PWD; else d=$PWD/ab_$1; fi
  (cd $d && PYTHONPATH=$d timeout 150 python3 -m nanograph bench floor --model $2 $3 --graph full --repeats 20 --out $R/$4_$1.json > $R/$4_$1.log 2>&1)
  echo "$4 $1: $(grep -h 'graph replays alone' $R/$4_$1.log | grep -o 'graph replays alone [0-9.]* ms') $(grep -h 'busy' $R/$4_$1.log | grep -o '_paged_attention_kernel [0-9.]*' | head -1)"
}
for v in base tree; do [ $SECONDS -lt 400 ] && run $v qwen3-0.6b "--decode-batch 1 --lengths 512" f06_1; done
for v in base tree; do [ $SECONDS -lt 380 ] && run $v qwen3-30b-a3b "--decode-batch 1 --lengths 512" f30b; done
for v in base tree; do [ $SECONDS -lt 420 ] && run $v qwen3-0.6b "--lengths 8192" p8k; done
for v in base tree; do [ $SECONDS -lt 450 ] && run $v qwen3-0.6b "--decode-batch 1 --lengths 512" f06_2; done
grep -h "8192" $R/p8k_*.log | head -4
cd $OUT && tar czf results.tgz r && rm -rf r/*.json r/f*.log r/p8k*.log
cd ~/.triton && tar czf $OUT/triton_cache.tgz --exclude='*.llir' --exclude='*.ttir' --exclude='*.ttgir' --exclude='*.ptx' --exclude='*.source' cache
