set -u
export NANOGRAPH_COMMIT=7e80e70 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
root=$PWD; o=$OUT/r; mkdir -p $o ~/.triton; tar xzf .triton_cache.tgz -C ~/.triton
i=0; for files in "test_spec_gpu.py" "test_hardening_gpu.py test_engine_gpu.py" "test_fused_decode_gpu.py test_runners_gpu.py" "test_moe_gpu.py"; do
  (PYTHONPATH=$root timeout 260 python3 -m pytest -q -p no:cacheprovider -rfE $(printf 'tests/gpu/%s ' $files) > $o/gpu_tests_$i.log 2>&1) &
  i=$((i+1)); done; wait
for f in $o/gpu_tests_*.log; do echo "== $f"; grep -E "^(FAILED|ERROR)|passed|failed" $f | tail -4; done
for r in 1 2; do for t in main new; do d=$root; [ $t = main ] && d=$root/ab/main
  (cd $d && PYTHONPATH=$d timeout 100 python3 -m nanograph bench spec --target qwen3-8b --arms draft:4 --batches 1 --repeats 3 --out $o/spec_draft_${t}_$r.json 2>&1 | grep -v -i "warn\|^INFO" > $o/spec_draft_${t}_$r.log)
  echo "draft $t $r: $(grep -oE "'draft_loop': [0-9.]+|'drafter_decode': [0-9.]+|steps': [0-9.]+|verify_over_decode': [0-9.]+" $o/spec_draft_${t}_$r.log | tr '\n' ' ')"
done; done
cd $OUT && tar czf r.tgz r
