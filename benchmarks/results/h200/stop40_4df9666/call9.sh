export NANOGRAPH_COMMIT=412a378 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
root=$PWD; o=$OUT/r; mkdir -p $o ~/.triton; tar xzf .triton_cache.tgz -C ~/.triton; cp ab/count_extend.py /tmp/
for t in new prev; do d=$root; [ $t = prev ] && d=$root/ab/prev
  (cd $d && PYTHONPATH=$d python3 /tmp/count_extend.py $o/spec_$t.json $t 2>&1 | grep -v "^INFO" | grep -E "batch|replays" | tee $o/count_$t.log)
done
cd $OUT && tar czf r.tgz r
