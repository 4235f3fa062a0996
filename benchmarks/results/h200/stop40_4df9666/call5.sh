set -u
export NANOGRAPH_COMMIT=4df9666 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
root=$PWD; o=$OUT/r; mkdir -p $o ~/.triton; tar xzf .triton_cache.tgz -C ~/.triton
nvidia-smi --query-gpu=name,clocks.sm --format=csv > $o/device.txt
for t in new main; do d=$root; [ $t != new ] && d=$root/ab/$t
  (cd $d && PYTHONPATH=$d timeout 200 python3 -m nanograph bench decode --models qwen3-0.6b,qwen3-8b --arms full --batches 1,2,8 --repeats 3 --out $o/decode_$t.json 2>&1 | grep -v "^INFO" > $o/decode_$t.log)
  echo "== $t"; grep -iE "tok/s" $o/decode_$t.log | tail -8
done | tee $o/decode_ab.log
cd $OUT && tar czf r.tgz r
