#!/usr/bin/env bash
# (stop 52: the Gluon prototypes these stages ran are removed, landed as
#  kernels/attention_hopper.py; run a stage from the commit its results name, e.g. 4e41363)
# Stop 50's device calls, run back to back (the machine goes after 30 s idle). From the repo
# root with NANOGRAPH_COMMIT exported:
#   bash docs/wip/stop50_calls.sh tests $OUT/r     # ~6 min: run_device.sh tests-parallel
#     (every tests/gpu file but tensor parallelism, five groups) (a015a3c's sorted regime never ran beyond 42 of test_moe_gpu.py's 43), then the
#     Triton cache into $OUT/triton_cache.tgz
#   bash docs/wip/stop49_calls.sh moe_prefill $OUT/r  # ~6 min: gpt-oss-20b MXFP4, qwen3-30b-a3b
#   bash docs/wip/stop50_calls.sh coverage $OUT/r  # ~8 min: the MoE rows of the coverage table
#     with the triton MoE (its 256-token prefill cells predate the sorted GEMMs' tiles)
#   bash docs/wip/stop50_calls.sh native $OUT/r    # ~5 min: docs/wip/native_moe_time.py (the
#     native MoE's loop before and after this stop), coverage of torch_native under breakable
#   bash docs/wip/stop50_calls.sh tma $OUT/r       # ~4 min: docs/wip/moe_tma_sweep.py
#   bash docs/wip/stop50_calls.sh gluon $OUT/r     # ~3 min: docs/wip/gluon_attention_proto.py
#   bash docs/wip/stop50_calls.sh short $OUT/r     # ~9 min: tests (300 s), native time, coverage
#   bash docs/wip/stop49_calls.sh oss120 $OUT/r    # ~5 min, H200 only
set -uo pipefail
stage=$1 out=$(mkdir -p "$2" && cd "$2" && pwd)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv > "$out/gpu_$stage.txt"
[ -f .triton_cache.tgz ] && mkdir -p ~/.triton && tar xzf .triton_cache.tgz -C ~/.triton
case $stage in
  tests)  # run_device.sh's parallel groups (every tests/gpu file but tensor parallelism)
    bash benchmarks/run_device.sh tests-parallel "$out"
    (cd ~/.triton && tar czf "$out/../triton_cache.tgz" --exclude='*.llir' --exclude='*.ttir' \
      --exclude='*.ttgir' --exclude='*.ptx' --exclude='*.source' cache) ;;
  coverage)
    for m in qwen3-30b-a3b gpt-oss-20b; do
      timeout 270 python3 -m nanograph bench coverage --models $m --moe-backends triton \
        --out "$out/coverage_$m.json" > "$out/coverage_$m.log" 2>&1
      tail -n 5 "$out/coverage_$m.log"
    done ;;
  native)  # the native MoE's two launches an expert: one layer's time, then breakable over eager
    cp docs/wip/native_moe_time.py /tmp/native_moe_time.py
    timeout 120 python3 /tmp/native_moe_time.py 2>&1 | grep -v -i warn | tee "$out/native_moe_time.log"
    for m in qwen3-30b-a3b gpt-oss-20b; do
      timeout 200 python3 -m nanograph bench coverage --models $m --moe-backends torch_native \
        --backends breakable --out "$out/coverage_native_$m.json" > "$out/coverage_native_$m.log" 2>&1
      tail -n 4 "$out/coverage_native_$m.log"
    done ;;
  tma)  # docs/wip/moe_tma_sweep.py: the sorted MoE GEMMs with weights (and A) through TMA
    timeout 300 python3 docs/wip/moe_tma_sweep.py --out "$out/tma.json" 2>&1 | grep -v -i warn \
      | tee "$out/tma.log" | tail -n 30 ;;
  gluon)  # docs/wip/gluon_attention_proto.py: FA3-style Hopper attention against ours and SDPA's
    timeout 280 python3 docs/wip/gluon_attention_proto.py --out "$out/gluon_attention.json" 2>&1 \
      | grep -v -i warn | tee "$out/gluon_attention.log" | tail -n 40 ;;
  short)  # one call when little device time is left: the tests, then the native MoE's time
    TEST_TIMEOUT=300 bash "$0" tests "$out"
    cp docs/wip/native_moe_time.py /tmp/native_moe_time.py
    timeout 90 python3 /tmp/native_moe_time.py 2>&1 | grep -v -i warn | tee "$out/native_moe_time.log"
    timeout 150 python3 -m nanograph bench coverage --models qwen3-30b-a3b --moe-backends \
      torch_native --backends breakable --out "$out/coverage_native_qwen3-30b-a3b.json" \
      > "$out/coverage_native_qwen3-30b-a3b.log" 2>&1
    tail -n 4 "$out/coverage_native_qwen3-30b-a3b.log" ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
