set -u
export NANOGRAPH_COMMIT=${C:-wip} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
root=$PWD; o=$OUT/r; mkdir -p $o ~/.triton; tar xzf .triton_cache.tgz -C ~/.triton
cp ab/prof_gaps.py /tmp/
g=("tests/gpu/test_runners_gpu.py" "tests/gpu/test_engine_gpu.py tests/gpu/test_spec_gpu.py")
for i in 0 1; do (PYTHONPATH=$root timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE ${g[$i]} > $o/t$i.log 2>&1) & done
wait; for i in 0 1; do echo "== ${g[$i]}"; grep -E "^(FAILED|ERROR)|passed|failed" $o/t$i.log | tail -4; done
(PYTHONPATH=$root timeout 90 python3 /tmp/prof_gaps.py new 2>&1 | grep -v "^INFO\|Warn\|warn" > $o/prof_gaps_new.log); grep "==\|Memcpy" $o/prof_gaps_new.log
for i in 1; do for t in main new; do d=$root; [ $t = main ] && d=$root/ab/main
  (cd $d && PYTHONPATH=$d timeout 60 python3 -m nanograph bench decode --models qwen3-0.6b --arms full --batches 1,8 --repeats 3 --out $o/decode_${t}_$i.json 2>&1 | grep -v "^INFO" > $o/decode_${t}_$i.log); echo "$t $i: $(grep -iE 'tok/s|full' $o/decode_${t}_$i.log | head -3 | tr '\n' ' ')"
done; done
cd $OUT && tar czf r.tgz r
