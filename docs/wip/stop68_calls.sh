#!/usr/bin/env bash
# Stop 68's device call, from the repo root with NANOGRAPH_COMMIT exported:
#   LIMIT=560 bash docs/wip/stop68_calls.sh one $OUT/o; cd $OUT && tar czf r.tgz o
# (short of budget: LIMIT=330 DECODE_MODELS=qwen3-8b DECODE_BATCHES=1 ...)
# First the tests/gpu files this stop's changes run through (min_tokens masking and
# prompt_logprobs in the engine's step, the server-facing front, start-up without GC), five
# processes. Then, on an H200, the decode aims (unmeasured there since stop 44); on an H100,
# the other tests/gpu files but the kernels' (unchanged since stop 64's run) and TP.
set -uo pipefail
stage=$1 out=$(mkdir -p "$2" && cd "$2" && pwd)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
begin=$(date +%s)
left() { echo $((${LIMIT:-560} - ($(date +%s) - begin))); }
tests() {  # files..., each its own process, under TEST_TIMEOUT
  for f in "$@"; do
    timeout "${TEST_TIMEOUT:-230}" python3 -m pytest -q -p no:cacheprovider -rfE --durations=3 \
      "tests/gpu/$f.py" > "$out/$f.log" 2>&1 &
  done
  wait; for f in "$@"; do echo "$f: $(grep -E "passed|failed|error" "$out/$f.log" | tail -1)"; done
}
case $stage in
  one)
    tests test_sampling_gpu test_engine_gpu test_hardening_gpu test_front_gpu test_prefix_gpu
    echo "core tests done at $(( $(date +%s) - begin )) s"
    if grep -q H200 "$out/gpu.txt"; then
      [ "$(left)" -gt 120 ] || { echo "no time left for the decode aims"; exit 0; }
      timeout "$(left)" python3 -m nanograph bench decode \
        --models "${DECODE_MODELS:-qwen3-0.6b,qwen3-8b,qwen3-30b-a3b}" --arms full \
        --batches "${DECODE_BATCHES:-1,8}" --repeats 3 \
        --out "$out/decode.json" > "$out/decode.log" 2>&1
      echo "decode rc=$? at $(( $(date +%s) - begin )) s"
      grep -E "decode=|roofline" "$out/decode.log" | tail -12
    else
      [ "$(left)" -gt 150 ] || { echo "no time left for the other tests"; exit 0; }
      TEST_TIMEOUT=$(( $(left) - 10 )) tests test_moe_gpu test_spec_gpu test_runners_gpu \
        test_graph_backends test_live_capture_gpu
    fi ;;
  quick)  # little budget: the file of this stop's CUDA-path changes, and the engine's
    tests test_sampling_gpu test_engine_gpu ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
