export NANOGRAPH_COMMIT=de95c32+normpdl PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p ~/.triton && tar xzf .triton_cache.tgz -C ~/.triton
R=$OUT/r; mkdir -p $R; root=$PWD
fl() { # dir label model rep
  (cd $1 && PYTHONPATH=$PWD timeout 170 python3 -m nanograph bench floor --model $3 \
    --decode-batch 1 --lengths 512 --graph full --repeats 20 \
    --out $R/floor_$3_$2_$4.json > $R/floor_$3_$2_$4.log 2>&1)
  echo "$3 $2 $4: $(grep -o 'graph replays alone [0-9.]* ms' $R/floor_$3_$2_$4.log)"
}
for i in 1 2; do fl $root/ab/main main qwen3-8b $i; fl $root new qwen3-8b $i; done
fl $root/ab/main main qwen3-30b-a3b 1; fl $root new qwen3-30b-a3b 1
timeout 150 python3 -m nanograph bench decode --models qwen3-8b --arms full --batches 1,8 \
  --repeats 3 --out $R/decode_8b.json > $R/decode_8b.log 2>&1; grep -v INFO $R/decode_8b.log | grep -E "decode=|roofline"
G=tests/gpu
timeout 230 python3 -m pytest -q -p no:cacheprovider $G/test_kernels_fused.py $G/test_fused_decode_gpu.py $G/test_engine_gpu.py > $R/t0.log 2>&1 &
timeout 230 python3 -m pytest -q -p no:cacheprovider $G/test_moe_gpu.py > $R/t1.log 2>&1 &
timeout 230 python3 -m pytest -q -p no:cacheprovider $G/test_runners_gpu.py $G/test_graph_backends.py $G/test_hardening_gpu.py > $R/t2.log 2>&1 &
wait
for i in 0 1 2; do tail -1 $R/t$i.log; grep -E "^(FAILED|ERROR)" $R/t$i.log | head -5; done
tar czf $OUT/r.tgz -C $OUT r
