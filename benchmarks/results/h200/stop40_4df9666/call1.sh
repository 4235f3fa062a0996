set -u
export NANOGRAPH_COMMIT=47c4afc PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PYTHONPATH=$PWD
o=$OUT/r; mkdir -p $o ~/.triton; tar xzf .triton_cache.tgz -C ~/.triton
nvidia-smi --query-gpu=name,clocks.sm --format=csv > $o/device.txt
cp ab/prof_draft.py /tmp/
timeout 200 python3 /tmp/prof_draft.py $o 2>&1 | grep -v "^INFO" > $o/prof_draft.log
timeout 100 python3 -m nanograph bench gemv --models qwen3-0.6b --rep-ms 60 --out $o/gemv1.json 2>&1 | grep -v "^INFO" > $o/gemv1.log
timeout 220 python3 -m nanograph bench gemv --models qwen3-0.6b --rows 2,5 --blas cublas --sweep --rep-ms 60 --out $o/gemv_rows.json 2>&1 | grep -v "^INFO" > $o/gemv_rows.log
tail -5 $o/gemv1.log; tail -14 $o/gemv_rows.log; head -12 $o/prof_draft.log
cd $OUT && tar czf r.tgz r
