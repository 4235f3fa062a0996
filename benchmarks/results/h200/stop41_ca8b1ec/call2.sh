set -u
export NANOGRAPH_COMMIT=${C:-wip} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
root=$PWD; o=$OUT/r; mkdir -p $o ~/.triton; tar xzf .triton_cache.tgz -C ~/.triton
cp ab/ab_rows.py ab/sweep2.py /tmp/
(PYTHONPATH=$root timeout 200 python3 /tmp/sweep2.py 2 $o/sweep2.json 2>&1 | grep -v "^INFO" > $o/sweep2.log); cat $o/sweep2.log
for i in 1 2; do for t in main new; do d=$root; [ $t = main ] && d=$root/ab/main
  (cd $d && PYTHONPATH=$d timeout 150 python3 /tmp/ab_rows.py $t 2>&1 | grep -v "^INFO" > $o/ab_${t}_$i.log); grep -E "batch|b2b|replays" $o/ab_${t}_$i.log
done; done
cd $OUT && tar czf r.tgz r
