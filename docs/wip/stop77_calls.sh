#!/usr/bin/env bash
# Stop 77's device call, from the repo root with NANOGRAPH_COMMIT exported and the Triton
# cache unpacked:
#   bash docs/wip/stop77_calls.sh pin $OUT/p   # ~4 min, any H100/H200: is gpt-oss-20b's
#     bimodal native prefill (whole runs 1.5x slower in both arms, stops 76 and 77) the bench
#     process's host placement? The host's CPUs and governor, then `bench prefill` at 256
#     (native MoE, breakable beside eager) pinned to one core (`taskset -c $CORE`) with the
#     native loop before bbab7b7 (`base`) and with its NN products without bias (`both`: stop
#     76's native_experts_nn.patch + native_bias_rows.patch, run at 322c009 and landed as
#     bbab7b7; the script now gets `base` by reversing native_nn_mm_landed.patch), A B B A B A,
#     and `base` unpinned twice: if pinned runs agree with each other where unpinned ones do
#     not, the A/B is read from the pinned runs only
set -uo pipefail
stage=$1 out=$(mkdir -p "$2" && cd "$2" && pwd)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
args=(prefill --models gpt-oss-20b --lengths 256 --arms breakable --moe-backend torch_native
  --peer-lengths '' --repeats 15 --eager-beside)
run() {  # run NAME [taskset args]: one bench process; prints its paired ratio
  local name=$1; shift
  timeout "${LIMIT:-90}" "$@" python3 -m nanograph bench "${args[@]}" --out "$out/$name.json" \
    > "$out/$name.log" 2>&1
  echo "$name: $(grep -o 'paired: 256=[0-9.]*x' "$out/$name.log")"
}
case $stage in
  pin)
    { lscpu; nproc; cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor; } \
      > "$out/host.txt" 2>&1
    grep -E "^(Model name|CPU\(s\)|NUMA|Thread)" "$out/host.txt"
    core=${CORE:-4} n=0
    old=docs/wip/native_nn_mm_landed.patch
    for arm in base both both base both base; do
      if [ $arm = base ]; then git apply -R $old; fi
      run "pinned_${arm}_$((++n))" taskset -c "$core"
      if [ $arm = base ]; then git apply $old; fi
    done
    git apply -R $old
    run unpinned_base_7
    run unpinned_base_8
    git apply $old
    python3 - "$out" <<'PY'
import json, pathlib, statistics, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("*_[0-9].json"), key=lambda f: f.stem[-1]):
    arm = json.loads(f.read_text())["models"]["gpt-oss-20b"]["arms"]["breakable"]
    b, e = arm["samples_ms"]["256"], arm["eager_beside"]["samples_ms"]["256"]
    print(f"{f.stem:18} breakable {statistics.median(b):6.2f} ({min(b):.1f}-{max(b):.1f})"
          f"  eager {statistics.median(e):6.2f} ({min(e):.1f}-{max(e):.1f})")
PY
    ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
