set -u
export NANOGRAPH_COMMIT=47c4afc+splitk PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
root=$PWD; o=$OUT/r; mkdir -p $o ~/.triton; tar xzf .triton_cache.tgz -C ~/.triton
nvidia-smi --query-gpu=name,clocks.sm --format=csv > $o/device.txt
cp ab/prof_draft.py /tmp/
(PYTHONPATH=$root timeout 200 python3 -m nanograph bench gemv --models qwen3-0.6b,qwen3-8b --rows 2,5 --blas cublas --sweep --rep-ms 60 --out $o/gemv_rows.json 2>&1 | grep -v "^INFO" > $o/gemv_rows.log)
grep "products per step" $o/gemv_rows.log
for i in 1 2; do for t in main new nopdl; do d=$root; [ $t != new ] && d=$root/ab/$t
  (cd $d && PYTHONPATH=$d timeout 90 python3 /tmp/prof_draft.py $o 2>&1 | grep -v "^INFO" > $o/prof_${t}_$i.log)
  echo "$t $i: $(grep -E '^[14] ' $o/prof_${t}_$i.log | tr '\n' ' ')"
done; done | tee $o/prof_ab.log
cd $OUT && tar czf r.tgz r
