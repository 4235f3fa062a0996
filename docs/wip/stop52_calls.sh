#!/usr/bin/env bash
# (stop 52: the Gluon prototypes these stages ran are removed, landed as
#  kernels/attention_hopper.py; run a stage from the commit its results name, e.g. 4e41363)
# Stop 52's last device call, from the repo root with NANOGRAPH_COMMIT exported:
#   bash docs/wip/stop52_calls.sh verify $OUT/r   # ~6 min
#   bash docs/wip/stop52_calls.sh hopper $OUT     # ~4 min (logs straight under $OUT: a call cut
#     short by the budget still returns them)
# 1. test_moe_gpu.py's native-MoE tests (the loop's per-expert views now come from one split /
#    unbind: a CUDA path, verified here before it is called done);
# 2. native_moe_time.py: one layer, before stop 50 / stop 50 / now. PREDICTED at 256 tokens:
#    now 25-35% below stop 50 (gpt-oss-20b ~3.0 -> ~2.1 ms, qwen3-30b-a3b ~8.4 -> ~5.8 ms), the
#    share the CPU machine's host-cost check measured (0.29 -> 0.21 ms, 0.81 -> 0.54 ms);
# 3. gluon_extend_proto.py with graph-replay timing (stop 52's launch timing synced inside).
set -uo pipefail
stage=$1 out=$(mkdir -p "$2" && cd "$2" && pwd)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv > "$out/gpu_$stage.txt"
case $stage in
  verify)
    timeout 240 python3 -m pytest -q -p no:cacheprovider -rfE tests/gpu/test_moe_gpu.py -k native \
      > "$out/test_moe_native.log" 2>&1; tail -n 3 "$out/test_moe_native.log"
    cp docs/wip/native_moe_time.py /tmp/native_moe_time.py
    timeout 120 python3 /tmp/native_moe_time.py 2>&1 | grep -v -i warn | tee "$out/native_moe_time.log"
    timeout 200 python3 docs/wip/gluon_extend_proto.py --out "$out/extend.json" 2>&1 \
      | grep -v -i warn | tee "$out/extend.log" | tail -n 42 ;;
  hopper)  # kernels/attention_hopper.py in the engine: its tests, then qwen3-0.6b's 8k prefill
    # under full with it and without (NANOGRAPH_HOPPER_ATTENTION=0). PREDICTED: 8192 tokens
    # ~4.5 ms faster (28 layers x (0.60 - 0.44) ms), ~28.5 ms against ~33 (H100; power-capped)
    timeout 110 python3 -m pytest -q -p no:cacheprovider -rfE tests/gpu/test_kernels_attention.py \
      -k "hopper or new_keys or extend" > "$out/test_attention.log" 2>&1; tail -n 4 "$out/test_attention.log"
    for h in 1 0; do
      NANOGRAPH_HOPPER_ATTENTION=$h timeout 70 python3 -m nanograph bench prefill --models qwen3-0.6b \
        --lengths 8192 --arms full --peer-lengths '' --repeats 5 --out "$out/prefill_hopper$h.json" \
        > "$out/prefill_hopper$h.log" 2>&1
      echo "hopper=$h"; grep -E "full:|SM clock" "$out/prefill_hopper$h.log"
    done ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
