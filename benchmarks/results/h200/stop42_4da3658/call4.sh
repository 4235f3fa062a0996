export NANOGRAPH_COMMIT=f013cb6+maxhidden PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p ~/.triton && tar xzf .triton_cache.tgz -C ~/.triton
R=$OUT/r; mkdir -p $R
fl() { # model fused rep
  timeout 170 python3 -m nanograph bench floor --model $1 --decode-batch 1 --lengths 512 \
    --graph full --repeats 20 --fused-decode $2 --out $R/floor_$1_$2_$3.json > $R/floor_$1_$2_$3.log 2>&1
  echo "$1 $2 $3: $(grep -o 'graph replays alone [0-9.]* ms' $R/floor_$1_$2_$3.log)"
}
for i in 1 2; do fl gpt-oss-20b auto $i; fl gpt-oss-20b always $i; done
fl qwen3-30b-a3b auto 1; fl qwen3-30b-a3b off 1
fl qwen3-8b auto 1; fl qwen3-8b always 1
timeout 200 python3 -m nanograph bench decode --models qwen3-8b --arms full,full:fused --batches 1 \
  --repeats 3 --out $R/decode_8b.json > $R/decode_8b.log 2>&1; grep -v INFO $R/decode_8b.log | tail -8
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_fused_decode_gpu.py tests/gpu/test_moe_gpu.py -k "fused" > $R/tests.log 2>&1; tail -2 $R/tests.log
grep -E "^(FAILED|ERROR)" $R/tests.log | head
tar czf $OUT/r.tgz -C $OUT r
