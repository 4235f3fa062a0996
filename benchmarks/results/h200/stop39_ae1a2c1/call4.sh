set -u
export NANOGRAPH_COMMIT=ae1a2c1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
root=$PWD; o=$OUT/r; mkdir -p $o ~/.triton; tar xzf .triton_cache.tgz -C ~/.triton
nvidia-smi --query-gpu=name,clocks.sm --format=csv > $o/device.txt
run() { # tree name timeout cmd...
  local d=$1 n=$2 t=$3; shift 3
  (cd $d && PYTHONPATH=$d timeout $t python3 -m nanograph "$@" 2>&1 | grep -v -i "warn\|^INFO" > $o/$n.log)
}
for i in 1 2; do for t in main new; do d=$root; [ $t = main ] && d=$root/ab/main
  run $d spec_ab_${t}_$i 120 bench spec --target qwen3-8b --arms ngram:4 --batches 1,4 --repeats 5 --out $o/spec_ab_${t}_$i.json
  echo "spec $t $i: $(grep -oE 'batch [0-9]+:|verify_over_decode_back_to_back.: [0-9.]+|.verify.: [0-9.]+|.decode.: [0-9.]+' $o/spec_ab_${t}_$i.log | tr '\n' ' ')"
done; done
run $root spec_full 360 bench spec --target qwen3-8b --drafter qwen3-0.6b --arms off,ngram:2,ngram:4,ngram:8,draft:4,self:4 --batches 1,4,16,64 --new-tokens 128 --repeats 2 --out $o/spec_full.json
tail -30 $o/spec_full.log
cd $OUT && tar czf r.tgz r
