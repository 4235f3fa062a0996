set -x
export NANOGRAPH_COMMIT=f013cb6 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p ~/.triton && tar xzf .triton_cache.tgz -C ~/.triton
R=$OUT/r; mkdir -p $R; cp docs/wip/prof_host_gap.py /tmp/
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt
timeout 120 python3 ab/graph_launch.py > $R/graph_launch.log 2>&1
PYTHONPATH=$PWD timeout 200 python3 /tmp/prof_host_gap.py qwen3-8b > $R/gap_8b.log 2>&1
PYTHONPATH=$PWD timeout 150 python3 /tmp/prof_host_gap.py qwen3-0.6b > $R/gap_06b.log 2>&1
tar czf $OUT/r.tgz -C $OUT r
cat $R/graph_launch.log; grep -v INFO $R/gap_8b.log | tail -20; grep -v INFO $R/gap_06b.log | tail -20
