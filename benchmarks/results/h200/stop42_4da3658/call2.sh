export NANOGRAPH_COMMIT=f013cb6 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p ~/.triton && tar xzf .triton_cache.tgz -C ~/.triton
R=$OUT/r; mkdir -p $R; root=$PWD
fl() { # tree model batch rep
  (cd $root/ab/$1 && PYTHONPATH=$PWD timeout 150 python3 -m nanograph bench floor --model $2 \
    --decode-batch $3 --lengths 512 --graph full --repeats 20 --out $R/floor_$2_b$3_$1_$4.json \
    > $R/floor_$2_b$3_$1_$4.log 2>&1)
  echo "$2 b$3 $1 $4: $(grep -o 'graph replays alone [0-9.]* ms' $R/floor_$2_b$3_$1_$4.log) $(grep -o 'back to back [0-9.]* ms' $R/floor_$2_b$3_$1_$4.log | head -1)"
}
for i in 1 2; do for t in main v1 v2; do fl $t qwen3-0.6b 1 $i; done; done
for t in main v1 v2; do fl $t qwen3-30b-a3b 1 1; done
tar czf $OUT/r.tgz -C $OUT r
