set -u
export NANOGRAPH_COMMIT=412a378 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PYTHONPATH=$PWD
o=$OUT/r; mkdir -p $o ~/.triton; tar xzf .triton_cache.tgz -C ~/.triton
timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE tests/gpu/test_spec_gpu.py > $o/tests_spec.log 2>&1 &
timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE tests/gpu/test_runners_gpu.py tests/gpu/test_engine_gpu.py > $o/tests_runners.log 2>&1 &
wait; tail -n 3 $o/tests_spec.log $o/tests_runners.log
cp ab/prof_extend.py /tmp/; timeout 80 python3 /tmp/prof_extend.py 2>&1 | grep -v "^INFO" | grep -v Warn > $o/prof_extend.log; cat $o/prof_extend.log
timeout 150 python3 -m nanograph bench spec --target qwen3-8b --drafter qwen3-0.6b --arms draft:4,self:4 --batches 1,4 --repeats 3 --out $o/spec.json 2>&1 | grep -v "^INFO" > $o/spec.log; grep batch $o/spec.log
cd $OUT && tar czf r.tgz r
