export NANOGRAPH_COMMIT=5c56eaf+qhalves PYTHONPATH=$PWD
mkdir -p ~/.triton && tar xzf .triton_cache.tgz -C ~/.triton
R=$OUT/r; mkdir -p $R
P="python3 -m nanograph bench prefill --models qwen3-0.6b --lengths 2048,8192 --arms full --peer-lengths '' --repeats 10"
for i in 1 2; do
(cd ab/main && PYTHONPATH=$PWD NANOGRAPH_COMMIT=5c56eaf $P --out $R/pm_$i.json > $R/pm_$i.log 2>&1)
$P --out $R/pn_$i.json > $R/pn_$i.log 2>&1
done
T="timeout 330 python3 -m pytest -q -p no:cacheprovider"
$T tests/gpu/test_kernels_attention.py tests/gpu/test_kernels_fused.py > $R/t_att.log 2>&1 &
$T tests/gpu/test_engine_gpu.py tests/gpu/test_prefix_gpu.py > $R/t_engine.log 2>&1 &
$T tests/gpu/test_graph_backends.py tests/gpu/test_runners_gpu.py > $R/t_graph.log 2>&1 &
$T tests/gpu/test_hardening_gpu.py tests/gpu/test_spec_gpu.py > $R/t_hard.log 2>&1 &
wait
for f in $R/t_*.log; do echo $f; tail -n 2 $f; done
grep -h "FAILED\|Error" $R/t_*.log | head -20
for f in $R/p?_?.json; do python3 -c "import json;d=json.load(open('$f'));print('$f',{k:round(v,2) for k,v in d['models']['qwen3-0.6b']['arms']['full']['median_ms'].items()})"; done
cd $OUT && tar czf results.tgz r
