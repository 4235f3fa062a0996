set -x
export NANOGRAPH_COMMIT=5c56eaf+qrows PYTHONPATH=$PWD
mkdir -p ~/.triton && tar xzf .triton_cache.tgz -C ~/.triton
R=$OUT/r; mkdir -p $R
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernels_attention.py > $R/t_att.log 2>&1; tail -3 $R/t_att.log
# benches first (nothing beside them): floor 8k both trees, then prefill alternating
python3 -m nanograph bench floor --model qwen3-0.6b --lengths 8192 --graph full --out $R/floor_new.json > $R/floor_new.log 2>&1
(cd ab/main && PYTHONPATH=$PWD NANOGRAPH_COMMIT=5c56eaf python3 -m nanograph bench floor --model qwen3-0.6b --lengths 8192 --graph full --out $R/floor_main.json > $R/floor_main.log 2>&1)
for i in 1 2; do
python3 -m nanograph bench prefill --models qwen3-0.6b --lengths 2048,8192 --arms full,breakable --peer-lengths '' --repeats 10 --out $R/prefill_new_$i.json > $R/prefill_new_$i.log 2>&1
(cd ab/main && PYTHONPATH=$PWD NANOGRAPH_COMMIT=5c56eaf python3 -m nanograph bench prefill --models qwen3-0.6b --lengths 2048,8192 --arms full,breakable --peer-lengths '' --repeats 10 --out $R/prefill_main_$i.json > $R/prefill_main_$i.log 2>&1)
done
grep -h "kernel floor\|busy" $R/floor_*.log; for f in $R/prefill_*.log; do echo $f; grep -iE "full|breakable" $f | tail -4; done
cd ~/.triton && tar czf $OUT/triton_cache.tgz --exclude='*.llir' --exclude='*.ttir' --exclude='*.ttgir' --exclude='*.ptx' --exclude='*.source' cache
cd $OUT && tar czf results.tgz r
