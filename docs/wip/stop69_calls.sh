#!/usr/bin/env bash
# Stop 69's device calls, from the repo root with NANOGRAPH_COMMIT exported:
#   TEST_TIMEOUT=520 bash docs/wip/stop67_calls.sh tests $OUT/t   # every tests/gpu file but TP
#   LIMIT=570 bash docs/wip/stop69_calls.sh prof $OUT/p; cd $OUT && tar czf p.tgz p
# prof: why tc_piecewise prefills qwen3-30b-a3b's native MoE at 0.69x of eager (stop 66's
#   coverage, unpaired) where breakable is 1.44-1.49x: native_tc_profile.py (eager, breakable,
#   tc_piecewise, medians of 9 and one profiled prefill each), then the paired bench prefill
#   of both graph arms with eager beside; then, with the time left, decode at batch 8 on
#   qwen3-0.6b and qwen3-8b (issue 18: no slower than before; unmeasured on an H200 lately).
# PREDICTED: the paired tc_piecewise ratio below 1 too; its profile shows more GPU ops a layer
#   than breakable's (a copy at each split point) or pieces replayed eagerly.
set -uo pipefail
stage=$1 out=$(mkdir -p "$2" && cd "$2" && pwd)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
begin=$(date +%s)
left() { echo $((${LIMIT:-570} - ($(date +%s) - begin))); }
case $stage in
  prof)
    timeout "$(( $(left) - 60 ))" python3 docs/wip/native_tc_profile.py qwen3-30b-a3b \
      > "$out/tc_profile.log" 2>&1
    echo "profile rc=$? at $(( $(date +%s) - begin )) s"; grep -E "^== |^-- " "$out/tc_profile.log"
    [ "$(left)" -gt 150 ] || { echo "no time left for the paired arms"; exit 0; }
    timeout "$(left)" python3 -m nanograph bench prefill --models qwen3-30b-a3b --lengths 256 \
      --arms breakable,tc_piecewise --moe-backend torch_native --peer-lengths '' --repeats 9 \
      --eager-beside --out "$out/native_tc.json" > "$out/native_tc.log" 2>&1
    echo "paired rc=$? at $(( $(date +%s) - begin )) s"; grep -E "paired|: 256=" "$out/native_tc.log"
    [ "$(left)" -gt 120 ] || { echo "no time left for batch 8 decode"; exit 0; }
    timeout "$(left)" python3 -m nanograph bench decode --models qwen3-0.6b,qwen3-8b \
      --arms full --batches 8 --repeats 3 --out "$out/decode8.json" > "$out/decode8.log" 2>&1
    echo "decode rc=$? at $(( $(date +%s) - begin )) s"; grep -E "decode=|roofline" "$out/decode8.log" | tail -6 ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
