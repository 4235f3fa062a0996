set -u
export NANOGRAPH_COMMIT=${C:-wip} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
root=$PWD; o=$OUT/r; mkdir -p $o ~/.triton; tar xzf .triton_cache.tgz -C ~/.triton
nvidia-smi -L > $o/device.txt
g=("tests/gpu/test_gemv_gpu.py tests/gpu/test_fused_decode_gpu.py" "tests/gpu/test_kernels_attention.py" "tests/gpu/test_spec_gpu.py" "tests/gpu/test_runners_gpu.py tests/gpu/test_engine_gpu.py tests/gpu/test_hardening_gpu.py")
for i in 0 1 2 3; do
  (PYTHONPATH=$root timeout 330 python3 -m pytest -q -p no:cacheprovider -rfE -s ${g[$i]} > $o/t$i.log 2>&1) &
done
wait
for i in 0 1 2 3; do echo "== ${g[$i]}"; grep -E "^(FAILED|ERROR)|passed|failed|greedy agreement|kernels a decode" $o/t$i.log | tail -8; done
(PYTHONPATH=$root timeout 150 python3 -m nanograph bench gemv --rows 2,3,4 --models qwen3-0.6b,qwen3-8b --blas cublas --out $o/gemv_rows.json 2>&1 | grep -v "^INFO" > $o/gemv_rows.log)
grep -E "rows" $o/gemv_rows.log | head -40
cd ~/.triton && tar czf $OUT/triton_cache.tgz --exclude='*.llir' --exclude='*.ttir' --exclude='*.ttgir' --exclude='*.ptx' --exclude='*.source' cache
cd $OUT && tar czf r.tgz r
