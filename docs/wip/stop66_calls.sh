#!/usr/bin/env bash
# Stop 66's next device call, from the repo root with NANOGRAPH_COMMIT exported:
#   LIMIT=570 bash docs/wip/stop66_calls.sh one $OUT/o; cd $OUT && tar czf r.tgz o
# H200 (or DECODE_FIRST set): the decode aims first (bench decode qwen3-0.6b / 8b / 30b-a3b,
#   full, batch 1 and 8; unmeasured on an H200 since stop 44), then the profile below.
# Then: why tc_piecewise prefills qwen3-30b-a3b's native MoE at 0.69x of eager (stop 66's
#   coverage, unpaired) where breakable is 1.34x: docs/wip/native_tc_profile.py (eager,
#   breakable, tc_piecewise: medians of 9 and one profiled prefill each), then the paired
#   bench prefill of both graph arms.
# PREDICTED: the paired tc_piecewise ratio also below 1 (the coverage cells ran ~10 s apart on
#   one machine); its profile has ~2x breakable's GPU ops a layer if each split point copies
#   (a piece input fed by the split op) or a piece replays eagerly.
set -uo pipefail
stage=$1 out=$(mkdir -p "$2" && cd "$2" && pwd)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
begin=$(date +%s)
left() { echo $((${LIMIT:-570} - ($(date +%s) - begin))); }
case $stage in
  one)
    if grep -q H200 "$out/gpu.txt" || [ -n "${DECODE_FIRST:-}" ]; then
      timeout "$(( $(left) < 300 ? $(left) : 300 ))" python3 -m nanograph bench decode \
        --models qwen3-0.6b,qwen3-8b,qwen3-30b-a3b --arms full --batches 1,8 --repeats 3 \
        --out "$out/decode.json" > "$out/decode.log" 2>&1
      echo "decode rc=$? at $(( $(date +%s) - begin )) s"
      grep -E "decode=|roofline" "$out/decode.log" | tail -12
    fi
    [ "$(left)" -gt 200 ] || { echo "no time left for the tc_piecewise profile"; exit 0; }
    timeout "$(left)" python3 docs/wip/native_tc_profile.py qwen3-30b-a3b \
      > "$out/tc_profile.log" 2>&1
    echo "profile rc=$? at $(( $(date +%s) - begin )) s"; grep -E "^== |^-- " "$out/tc_profile.log"
    [ "$(left)" -gt 150 ] || { echo "no time left for the paired arms"; exit 0; }
    timeout "$(left)" python3 -m nanograph bench prefill --models qwen3-30b-a3b --lengths 256 \
      --arms breakable,tc_piecewise --moe-backend torch_native --peer-lengths '' --repeats 9 \
      --eager-beside --out "$out/native_tc.json" > "$out/native_tc.log" 2>&1
    echo "paired rc=$? at $(( $(date +%s) - begin )) s"; grep -E "paired|: 256=" "$out/native_tc.log"
    ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
