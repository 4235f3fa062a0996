#!/usr/bin/env bash
# Stop 67's device calls, from the repo root with NANOGRAPH_COMMIT exported:
#   LIMIT=560 bash docs/wip/stop66_calls.sh one $OUT/o   # decode aims on an H200, then why
#                                                        # tc_piecewise prefills q30 native slowly
#   bash docs/wip/stop67_calls.sh first $OUT/o   # on an H200 the call above, else the tests
#   bash docs/wip/stop67_calls.sh tests $OUT/t   # ~8 min: every tests/gpu file but TP, five
#                                                # processes (the kernel files as the fifth)
set -uo pipefail
stage=$1 out=$(mkdir -p "$2" && cd "$2" && pwd)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
case $stage in
  first)  # an H200: stop 66's call (decode aims, then the tc_piecewise profile); else the tests
    if grep -q H200 "$out/gpu.txt"; then LIMIT=${LIMIT:-540} bash docs/wip/stop66_calls.sh one "$out"
    else bash "$0" tests "$out"; fi ;;
  tests|tests4)  # tests4: without the kernel files (unchanged since stop 64's run)
    groups=("test_engine_gpu.py test_front_gpu.py" "test_moe_gpu.py test_spec_gpu.py"
      "test_graph_backends.py test_graph_memory.py test_runners_gpu.py"
      "test_sampling_gpu.py test_live_capture_gpu.py test_prefix_gpu.py test_hardening_gpu.py"
      "test_kernels_attention.py test_kernels_fused.py test_gemv_gpu.py test_fused_decode_gpu.py")
    [ "$stage" = tests4 ] && unset 'groups[4]'
    for i in "${!groups[@]}"; do
      timeout "${TEST_TIMEOUT:-500}" python3 -m pytest -q -p no:cacheprovider --durations=5 -rfE \
        $(printf 'tests/gpu/%s ' ${groups[$i]}) > "$out/gpu_tests_$i.log" 2>&1 &
    done
    wait; for f in "$out"/gpu_tests_*.log; do grep -E "passed|failed|error" "$f" | tail -4; done ;;
  core)  # ~3 min: the files whose engines start up (6fcdd50's GC) and serve the API's changes
    for f in test_engine_gpu test_hardening_gpu test_front_gpu test_prefix_gpu; do
      timeout "${TEST_TIMEOUT:-170}" python3 -m pytest -q -p no:cacheprovider -rfE \
        "tests/gpu/$f.py" > "$out/$f.log" 2>&1 &
    done
    wait; for f in "$out"/test_*.log; do echo "$f"; grep -E "passed|failed|error" "$f" | tail -3; done ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
