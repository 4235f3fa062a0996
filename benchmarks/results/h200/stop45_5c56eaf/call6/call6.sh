export NANOGRAPH_COMMIT=5c56eaf+qhalves PYTHONPATH=$PWD
mkdir -p ~/.triton && tar xzf .triton_cache.tgz -C ~/.triton
R=$OUT/r; mkdir -p $R
P="python3 -m nanograph bench prefill --models qwen3-0.6b --lengths 2048,8192 --arms full --peer-lengths= --repeats 10"
for i in 1 2; do
(cd ab/main && PYTHONPATH=$PWD NANOGRAPH_COMMIT=5c56eaf $P --out $R/pm_$i.json > $R/pm_$i.log 2>&1)
$P --out $R/pn_$i.json > $R/pn_$i.log 2>&1
done
for f in $R/p?_?.json; do python3 -c "import json;d=json.load(open('$f'));print('$f',{k:round(v,2) for k,v in d['models']['qwen3-0.6b']['arms']['full']['median_ms'].items()})"; done
tail -n 2 $R/pm_1.log
cd $OUT && tar czf results.tgz r
