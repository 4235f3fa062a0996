#!/usr/bin/env bash
# (stop 52: the Gluon prototypes these stages ran are removed, landed as
#  kernels/attention_hopper.py; run a stage from the commit its results name, e.g. 4e41363)
# Stop 51's open question for the device: why breakable prefill with the native MoE is only
# 1.29x eager on qwen3-30b-a3b and 0.85x on gpt-oss-20b (H100, d052049), after 7a62454 made
# the native loop 1.9-2.2x faster a layer (1.41x / 1.42x on the H200 at b4436f2, old loop).
# Prepare here, untracked (it travels with the tree):
#   mkdir -p ab && git archive 7a62454~1 nanograph | tar x -C ab
# then, from the repo root with NANOGRAPH_COMMIT exported:
#   bash docs/wip/stop51_calls.sh native_ab $OUT/r   # ~6 min: both trees alternating, twice
#   bash docs/wip/stop51_calls.sh host $OUT/r        # ~2 min: cProfile, eager against breakable
#   bash docs/wip/stop51_calls.sh extend $OUT/r      # ~3 min: docs/wip/gluon_extend_proto.py
# Predicted: if the break itself costs nothing beyond the loop, breakable/eager is the same in
# both trees and above 1.4x; a ratio that drops with the new loop points at the loop's `out=`
# buffers (allocated per call) or its sync inside a break.
set -uo pipefail
stage=$1 out=$(mkdir -p "$2" && cd "$2" && pwd)
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv > "$out/gpu_$stage.txt"
case $stage in
  native_ab)  # bench prefill at 256 tokens, torch_native, eager and breakable, both trees
    base=$(cd ab && pwd)
    cp nanograph/bench/common.py nanograph/bench/prefill.py "$base/nanograph/bench/"  # d052049's fix
    for i in 1 2; do for t in new base; do
      d=$PWD; [ $t = base ] && d=$base; name="native_${t}_$i"
      (cd "$d" && PYTHONPATH=$d timeout 170 python3 -m nanograph bench prefill \
        --models gpt-oss-20b,qwen3-30b-a3b --lengths 256 --arms eager,breakable \
        --moe-backend torch_native --peer-lengths '' --repeats 15 --out "$out/$name.json" \
        2>&1 | grep -v "^INFO" > "$out/$name.log")
      echo "== $t $i"; grep -A2 "speedup over eager" "$out/$name.log"
    done; done ;;
  host)  # where a breakable forward's host time goes with the native MoE, against eager
    export PYTHONPATH=$PWD
    for m in gpt-oss-20b qwen3-30b-a3b; do
      timeout 150 python3 -m nanograph bench host --model $m --workload prefill --tokens 256 \
        --arms eager,breakable --moe-backend torch_native --repeats 10 --top 30 \
        --out "$out/host_$m.json" > "$out/host_$m.log" 2>&1
      grep "^==" "$out/host_$m.log"
    done ;;
  extend)  # the Gluon attention behind the engine's extend interface (varlen, paged prefix,
    # sentinel slots, a graph replayed with other lengths) against paged_attention(new_kv=...)
    export PYTHONPATH=$PWD
    timeout 280 python3 docs/wip/gluon_extend_proto.py --out "$out/extend.json" 2>&1 \
      | grep -v -i warn | tee "$out/extend.log" | tail -n 40 ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
