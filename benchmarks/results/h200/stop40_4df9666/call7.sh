set -u
export NANOGRAPH_COMMIT=079c0a8 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PYTHONPATH=$PWD
o=$OUT/r; mkdir -p $o ~/.triton; tar xzf .triton_cache.tgz -C ~/.triton
nvidia-smi --query-gpu=name,clocks.sm --format=csv > $o/device.txt
timeout 250 python3 -m pytest -q -p no:cacheprovider -rfE tests/gpu/test_gemv_gpu.py tests/gpu/test_fused_decode_gpu.py > $o/tests_a.log 2>&1 &
timeout 250 python3 -m pytest -q -p no:cacheprovider -rfE tests/gpu/test_spec_gpu.py tests/gpu/test_runners_gpu.py > $o/tests_b.log 2>&1 &
wait; tail -2 $o/tests_a.log $o/tests_b.log
timeout 150 python3 -m nanograph bench spec --target qwen3-8b --drafter qwen3-0.6b --arms draft:4 --batches 1,4 --repeats 3 --out $o/spec.json 2>&1 | grep -v "^INFO" > $o/spec.log; grep batch $o/spec.log
cp docs/wip/slow_state_profile.py /tmp/
for f in "" --no-pdl; do echo "== slow state $f"; timeout 140 python3 /tmp/slow_state_profile.py qwen3-30b-a3b $f 2>&1 | grep -v "^INFO" | tail -30; done > $o/slow_state.log
cd $OUT && tar czf r.tgz r
