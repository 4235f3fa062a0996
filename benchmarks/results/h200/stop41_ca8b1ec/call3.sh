set -u
export NANOGRAPH_COMMIT=${C:-wip} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
root=$PWD; o=$OUT/r; mkdir -p $o ~/.triton; tar xzf .triton_cache.tgz -C ~/.triton
cp ab/ab_rows.py /tmp/
g=("tests/gpu/test_spec_gpu.py" "tests/gpu/test_runners_gpu.py tests/gpu/test_engine_gpu.py" "tests/gpu/test_gemv_gpu.py")
for i in 0 1 2; do
  (PYTHONPATH=$root timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE ${g[$i]} > $o/t$i.log 2>&1) &
done
wait
for i in 0 1 2; do echo "== ${g[$i]}"; grep -E "^(FAILED|ERROR)|passed|failed" $o/t$i.log | tail -5; done
for i in 1 2; do for t in main new; do d=$root; [ $t = main ] && d=$root/ab/main
  (cd $d && PYTHONPATH=$d timeout 100 python3 /tmp/ab_rows.py $t 2>&1 | grep -v "^INFO" > $o/ab_${t}_$i.log); grep -E "batch|b2b|replays" $o/ab_${t}_$i.log
done; done
(PYTHONPATH=$root timeout 200 python3 -m nanograph bench spec --target qwen3-8b --drafter qwen3-0.6b --arms draft:4,self:4 --batches 1,4 --repeats 3 --out $o/spec.json 2>&1 | grep -v "^INFO" > $o/spec.log)
grep "batch" $o/spec.log
cd $OUT && tar czf r.tgz r
