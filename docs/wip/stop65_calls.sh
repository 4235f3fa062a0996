#!/usr/bin/env bash
# Stop 65's device call (never run: nine starts failed), from the repo
# root with NANOGRAPH_COMMIT exported:
#   bash docs/wip/stop65_calls.sh one $OUT/o    # <= LIMIT (570) s, whichever GPU comes
# H100: bench coverage of qwen3-30b-a3b torch_native (the prefill column with 485d7e9's
#   prefix cache off), then, in the time left, native_expert_views.patch's GPU tests and its
#   A/B (one round of stop64_calls.sh's arm: HEAD, then with the patch).
# H200: the decode aims (stop62_calls.sh aims' decode line), then the native prefill aim at
#   HEAD, then with the patch if time is left.
# PREDICTED: stop64_calls.sh's (views: paired 1.40x -> ~1.44x on qwen3-30b-a3b, gpt-oss-20b
# ~+1%; coverage's breakable prefill ~1.4x).
set -uo pipefail
stage=$1 out=$(mkdir -p "$2" && cd "$2" && pwd)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
begin=$(date +%s)
left() { echo $((${LIMIT:-570} - ($(date +%s) - begin))); }  # LIMIT: the call's seconds
arm() {  # $1 label, $2 models: breakable prefill at 256 tokens beside eager, paired
  timeout "$(left)" python3 -m nanograph bench prefill --models "$2" --lengths 256 \
    --arms breakable --moe-backend torch_native --peer-lengths '' --repeats 15 \
    --eager-beside --out "$out/native_$1.json" > "$out/native_$1.log" 2>&1
  echo "== $1 rc=$? at $(( $(date +%s) - begin )) s"; grep -E "breakable: |paired" "$out/native_$1.log"
}
ab() {  # HEAD first (the aim as it stands), then with the patch, while time is left
  [ "$(left)" -gt 150 ] || { echo "no time left for the native arms"; return; }
  arm head qwen3-30b-a3b,gpt-oss-20b
  [ "$(left)" -gt 150 ] || { echo "no time left for the views arm"; return; }
  git apply docs/wip/native_expert_views.patch && arm views qwen3-30b-a3b,gpt-oss-20b
  git apply -R docs/wip/native_expert_views.patch
}
case $stage in
  one)
    if grep -q H200 "$out/gpu.txt" || [ -n "${DECODE_FIRST:-}" ]; then
      timeout "$(( $(left) < 300 ? $(left) : 300 ))" python3 -m nanograph bench decode \
        --models "${DECODE_MODELS:-qwen3-0.6b,qwen3-8b,qwen3-30b-a3b}" --arms full --batches "${BATCHES:-1,8}" --repeats 3 \
        --out "$out/decode.json" > "$out/decode.log" 2>&1
      echo "decode rc=$? at $(( $(date +%s) - begin )) s"
      grep -E "decode=|roofline" "$out/decode.log" | tail -12
      ab; exit 0
    fi
    if [ "$(left)" -lt 280 ]; then ab; exit 0; fi  # too short for coverage (~4 min)
    timeout "$(left)" python3 -m nanograph bench coverage --models qwen3-30b-a3b \
      --moe-backends torch_native --out "$out/coverage.json" > "$out/coverage.log" 2>&1
    echo "coverage rc=$? at $(( $(date +%s) - begin )) s"
    grep -v -i "warn\|^INFO" "$out/coverage.log" | tail -14
    [ "$(left)" -gt 300 ] || { echo "no time left for the views patch"; exit 0; }
    git apply docs/wip/native_expert_views.patch
    timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE tests/gpu/test_moe_gpu.py \
      -k "native or breakable or piecewise" > "$out/views_tests.log" 2>&1
    echo "views tests rc=$? at $(( $(date +%s) - begin )) s"; tail -n 1 "$out/views_tests.log"
    git apply -R docs/wip/native_expert_views.patch
    ab ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
