set -u
export NANOGRAPH_COMMIT=4df9666 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
root=$PWD; o=$OUT/r; mkdir -p $o ~/.triton; tar xzf .triton_cache.tgz -C ~/.triton
TEST_TIMEOUT=320 bash benchmarks/run_device.sh tests-parallel $o 2>&1 | tail -40
(PYTHONPATH=$root timeout 220 python3 -m nanograph bench spec --target qwen3-8b --drafter qwen3-0.6b --arms ngram:4,draft:4 --batches 1,4 --repeats 3 --out $o/spec.json 2>&1 | grep -v "^INFO" > $o/spec.log)
grep "batch" $o/spec.log
cd $OUT && tar czf r.tgz r
