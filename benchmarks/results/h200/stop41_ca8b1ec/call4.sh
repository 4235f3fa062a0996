set -u
export NANOGRAPH_COMMIT=${C:-wip} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
root=$PWD; o=$OUT/r; mkdir -p $o ~/.triton; tar xzf .triton_cache.tgz -C ~/.triton
g=("tests/gpu/test_graph_memory.py" "tests/gpu/test_live_capture_gpu.py" "tests/gpu/test_prefix_gpu.py" "tests/gpu/test_moe_gpu.py")
for i in 0 1 2 3; do
  (PYTHONPATH=$root timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE ${g[$i]} > $o/t$i.log 2>&1) &
done
wait
for i in 0 1 2 3; do echo "== ${g[$i]}"; grep -E "^(FAILED|ERROR)|passed|failed" $o/t$i.log | tail -5; done > $o/tests.txt; cat $o/tests.txt
PYTHONPATH=$root MODELS=qwen3-8b TESTS=0 timeout 320 bash benchmarks/run_device.sh prefill-verify $o > $o/prefill_stage.log 2>&1; tail -30 $o/prefill_stage.log
cd $OUT && tar czf r.tgz r
