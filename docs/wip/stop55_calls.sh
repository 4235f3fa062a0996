#!/usr/bin/env bash
# For the next device session (prepared in stop 53, extended in stop 54, which got no machine).
# From the repo root with NANOGRAPH_COMMIT exported, most important first:
#   bash docs/wip/stop55_calls.sh live_tests $OUT/t  # ~6 min: the three patches below
#     applied, every tests/gpu file but TP (five groups), reverted
#   bash docs/wip/stop55_calls.sh live_bench $OUT/b  # ~7 min: bench host, breakable and eager
#     prefill of qwen3-0.6b at 256 and 2048 tokens: main, + live, + all three; bench prefill
#     with all three
#   bash docs/wip/stop55_calls.sh native $OUT/n     # ~4 min: issue 15's native-MoE breakable
#     prefill over eager at 256 tokens, twice, without stop 53's clock sampler
#   bash docs/wip/stop55_calls.sh h200 $OUT/h       # ~8 min, on an H200 only: issue 18's
#     figures there with the Hopper extend (0.6b prefill, every arm and the peer; attention)
# The patches, applied in this order (each on top of the one before):
# live_query_range.patch: an eager extend passes its live batch's shortest and longest request
# (meta.query_lens_cpu) to paged_attention, which leaves out a launch whose range holds no
# request once that launch's kind has run in the process (a first launch loads its module,
# which a capture forbids). A one-prompt prefill then launches only the Hopper kernel a layer,
# not it and an empty Triton launch for short requests.
# launch_int_pointers.patch: LaunchCache's direct launches pass each tensor as its address, so
# Triton's launcher skips a data_ptr() call and a cuPointerGetAttribute per tensor argument
# (22 of them in the attention launch).
# attention_host_cost.patch (stop 54): both attention kernels' TMA descriptors from one cache
# (kernels/tma.py; the Triton kernel built two a launch), LaunchCache takes descriptors apart
# from the tensors (the tensors' key stays two plain passes), and the Hopper gate
# (attention_hopper.launch_descriptors) returns the launch's cached descriptors, which
# hopper_extend binds to the launch (one lookup each a call, where the gate checked six
# tensors and the launch looked the descriptors up again). SASS of all 73 sm90_compile
# variants identical to main's. On the CPU machine (launches mocked,
# docs/wip/attention_host_time.py, minimum of five runs): paged_attention's host time for one
# 256-token prompt through the Hopper route 53 us (main) -> 26.5 with the first two patches ->
# 21.2 with all three; through the Triton kernel alone 31.3 (main) -> 24.5 (all three).
# PREDICTED (stop 53's second H100 host, where the Hopper kernel on/off gave 10.66 / 6.13 ms at
# 256 tokens, and attention was 93% of the profiled Python): live: breakable at 256 ~6 ms;
# all three ~5-5.5 ms (below the Hopper-off 6.13); at 2048 ~9-10 ms (12.00 on, 10.26 off
# before); full unchanged (its launches are captured). Eager gains less (its other kernels'
# launches stay).
set -uo pipefail
stage=$1 out=$(mkdir -p "$2" && cd "$2" && pwd)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv > "$out/gpu_$stage.txt"
PATCHES="docs/wip/live_query_range.patch docs/wip/launch_int_pointers.patch
  docs/wip/attention_host_cost.patch"
REVERSED="docs/wip/attention_host_cost.patch docs/wip/launch_int_pointers.patch
  docs/wip/live_query_range.patch"
host() {  # $1: a name for the files
  for t in 256 2048; do
    timeout 120 python3 -m nanograph bench host --model qwen3-0.6b --workload prefill \
      --tokens $t --arms breakable,eager --repeats 30 --top 30 --out "$out/host_${t}_$1.json" \
      > "$out/host_${t}_$1.log" 2>&1
    echo "$1 $t: $(grep '^==.*per call' "$out/host_${t}_$1.log" | tr '\n' ' ')"
  done
}
case $stage in
  live_tests)
    git apply $PATCHES || exit 2
    bash benchmarks/run_device.sh tests-parallel "$out"
    git apply -R $REVERSED ;;
  live_bench)
    host main
    git apply docs/wip/live_query_range.patch || exit 2
    host live
    git apply docs/wip/launch_int_pointers.patch docs/wip/attention_host_cost.patch || exit 2
    host all
    timeout 200 python3 -m nanograph bench prefill --models qwen3-0.6b --lengths 256,2048,8192 \
      --peer-lengths '' --out "$out/prefill_all.json" > "$out/prefill_all.log" 2>&1
    grep -E "^qwen3-0.6b [a-z_]+:" "$out/prefill_all.log"
    git apply -R $REVERSED ;;
  native)  # issue 15: >= 1.5x at 256 tokens; stop 52 measured 1.22x / 1.55x with the sampler on
    for i in 1 2; do
      timeout 170 python3 -m nanograph bench prefill --models gpt-oss-20b,qwen3-30b-a3b \
        --lengths 256 --arms eager,breakable --moe-backend torch_native --peer-lengths '' \
        --repeats 15 --out "$out/native_$i.json" 2>&1 | grep -v "^INFO" > "$out/native_$i.log"
      echo "== run $i"; grep -A2 "speedup over eager" "$out/native_$i.log"
    done ;;
  h200)  # the Hopper extend was only ever measured on H100s (stops 52, 53)
    grep -q H200 "$out/gpu_$stage.txt" || { echo "not an H200"; exit 2; }
    timeout 300 python3 -m nanograph bench prefill --models qwen3-0.6b --lengths 256,2048,8192 \
      --out "$out/prefill_06b.json" > "$out/prefill_06b.log" 2>&1
    grep -E "^qwen3-0.6b [a-z_]+:" "$out/prefill_06b.log"
    timeout 200 python3 -m nanograph bench attention --cases \
      extend_1x8192,extend_1x32k,extend_1x8192_06b,extend_1x32k_06b,extend_32x256 \
      --out "$out/attention.json" > "$out/attention.log" 2>&1
    grep -E "^ *extend_" "$out/attention.log" ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
