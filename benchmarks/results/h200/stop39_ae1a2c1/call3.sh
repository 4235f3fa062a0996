set -u
export NANOGRAPH_COMMIT=ae1a2c1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
root=$PWD; o=$OUT/r; mkdir -p $o ~/.triton; tar xzf .triton_cache.tgz -C ~/.triton
nvidia-smi --query-gpu=name,clocks.sm --format=csv > $o/device.txt
PYTHONPATH=$root timeout 200 python3 -m pytest -q -s -p no:cacheprovider -rfE tests/gpu/test_gemv_gpu.py > $o/gpu_tests_gemv.log 2>&1
grep -E "positions agree|passed|failed" $o/gpu_tests_gemv.log | tail -3
run() { # tree name cmd...
  local d=$1 n=$2; shift 2
  (cd $d && PYTHONPATH=$d timeout 150 python3 -m nanograph "$@" 2>&1 | grep -v -i "warn\|^INFO" > $o/$n.log)
}
for t in new main; do d=$root; [ $t = main ] && d=$root/ab/main
  run $d spec_$t bench spec --target qwen3-8b --arms ngram:4 --batches 1,4 --repeats 5 --out $o/spec_$t.json
  echo "spec $t: $(grep -E 'batch' $o/spec_$t.log | head -2)"
done
for t in new main; do d=$root; [ $t = main ] && d=$root/ab/main
  run $d decode_$t bench decode --models qwen3-0.6b,qwen3-8b --arms full --batches 1,2,8 --repeats 3 --out $o/decode_$t.json
  echo "decode $t:"; grep -iE "tok/s" $o/decode_$t.log | head -8
done
cd $OUT && tar czf r.tgz r
