set -uo pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
root=$PWD; o=$1; mkdir -p $o
for t in c88 cur rev; do cp nanograph/bench/floor.py ab/$t/nanograph/bench/floor.py; done
for r in "cur 1" "rev 1" "c88 1" "cur 2" "rev 2"; do set -- $r; t=$1; i=$2; d=$root/ab/$t
  (cd $d && PYTHONPATH=$d timeout 60 python3 -m nanograph bench floor --model qwen3-30b-a3b --decode-batch 1 --lengths 512 --graph full --repeats 50 --out $o/floor30_${t}_$i.json 2>&1 | grep -v "^INFO" > $o/floor30_${t}_$i.log)
  echo "30b $t $i: $(grep -o 'graph replays alone [0-9.]* ms' $o/floor30_${t}_$i.log)"
done
# GPU tests of the engine paths, in the reverted tree (rev = this tree with 1ab02c9 undone)
rm -rf ab/rev/tests && cp -r tests ab/rev/tests
cd ab/rev
groups=("test_engine_gpu.py test_front_gpu.py test_sampling_gpu.py" "test_spec_gpu.py" "test_live_capture_gpu.py test_prefix_gpu.py test_hardening_gpu.py" "test_runners_gpu.py")
for g in "${!groups[@]}"; do files=$(printf 'tests/gpu/%s ' ${groups[$g]})
  PYTHONPATH=$PWD timeout 230 python3 -m pytest -q -p no:cacheprovider -rfE $files > $o/t_$g.log 2>&1 &
done; wait
for g in "${!groups[@]}"; do echo "== ${groups[$g]}"; grep -E "^(FAILED|ERROR)|passed|failed" $o/t_$g.log | tail -6; done
