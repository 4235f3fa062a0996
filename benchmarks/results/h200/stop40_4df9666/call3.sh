set -u
export NANOGRAPH_COMMIT=47c4afc+splitk2 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
root=$PWD; o=$OUT/r; mkdir -p $o ~/.triton; tar xzf .triton_cache.tgz -C ~/.triton
nvidia-smi --query-gpu=name,clocks.sm --format=csv > $o/device.txt
cp ab/prof_ab.py /tmp/
for i in 1 2; do for t in main new nopdl; do d=$root; [ $t != new ] && d=$root/ab/$t
  (cd $d && PYTHONPATH=$d timeout 100 python3 /tmp/prof_ab.py $t 2>&1 | grep -v "^INFO" | grep -v Warn > $o/ab_${t}_$i.log)
  grep "batch" $o/ab_${t}_$i.log
done; done | tee $o/ab.log
(PYTHONPATH=$root timeout 100 python3 -m nanograph bench gemv --models qwen3-0.6b,qwen3-8b --rows 2,5 --blas cublas --rep-ms 60 --out $o/gemv_rows.json 2>&1 | grep -v "^INFO" > $o/gemv_rows.log)
grep "products per step" $o/gemv_rows.log
cd ~/.triton && tar czf $o/triton_cache.tgz --exclude='*.llir' --exclude='*.ttir' --exclude='*.ttgir' --exclude='*.ptx' --exclude='*.source' cache
cd $OUT && tar czf r.tgz r
