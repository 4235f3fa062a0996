export NANOGRAPH_COMMIT=de95c32+onerowload PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p ~/.triton && tar xzf .triton_cache.tgz -C ~/.triton
R=$OUT/r; mkdir -p $R; root=$PWD
fl() { # dir label model fused rep
  (cd $1 && PYTHONPATH=$PWD timeout 100 python3 -m nanograph bench floor --model $3 \
    --decode-batch 1 --lengths 512 --graph full --repeats 20 --fused-decode $4 \
    --out $R/floor_$3_$2_$5.json > $R/floor_$3_$2_$5.log 2>&1)
  echo "$3 $2 $4 $5: $(grep -o 'graph replays alone [0-9.]* ms' $R/floor_$3_$2_$5.log)"
}
for i in 1 2; do fl $root/ab/main main qwen3-8b auto $i; fl $root new qwen3-8b always $i; done
for i in 1 2; do fl $root/ab/main main qwen3-0.6b auto $i; fl $root new qwen3-0.6b auto $i; done
fl $root/ab/main main qwen3-30b-a3b auto 1; fl $root new qwen3-30b-a3b auto 1
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gemv_gpu.py tests/gpu/test_fused_decode_gpu.py tests/gpu/test_kernels_fused.py > $R/tests.log 2>&1; tail -1 $R/tests.log
grep -E "^(FAILED|ERROR)" $R/tests.log | head
tar czf $OUT/r.tgz -C $OUT r
