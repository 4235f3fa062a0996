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
# Next stop's first call (structured outputs' GPU test: never run on a device yet; xgrammar and
# pydantic travel as wheels, see ../.library/device/README.md: .whl holds xgrammar 0.2.9,
# apache-tvm-ffi, pydantic 2.13.4, pydantic-core, annotated-types, typing-inspection,
# typing-extensions for cp312), with carry [".whl"]:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#     --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit
#   timeout 170 python3 -m pytest -q -p no:cacheprovider -rfE tests/gpu/test_sampling_gpu.py
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
  moeab)  # the zipped native loop (this tree) against 873e7cf's indexed one, alternating twice
    # PREDICTED: breakable prefill at 256 tokens ~1-2% shorter (0.1 us of 4-5 an expert's
    #   product), eager ~1% (its other work does not change): breakable over eager 1.49 -> ~1.51x
    cp nanograph/models/moe.py /tmp/moe_new.py; git show 873e7cf:nanograph/models/moe.py > /tmp/moe_old.py
    for round in 1 2; do for arm in new old; do
      cp /tmp/moe_$arm.py nanograph/models/moe.py
      timeout "$(left)" python3 -m nanograph bench prefill --models "${MOE_MODELS:-qwen3-30b-a3b,gpt-oss-20b}" \
        --lengths 256 --arms breakable --moe-backend torch_native --peer-lengths '' --repeats 9 \
        --eager-beside --out "$out/moe_${arm}_$round.json" > "$out/moe_${arm}_$round.log" 2>&1
      echo "$arm $round rc=$? at $(( $(date +%s) - begin )) s"; grep -E "paired|: 256=" "$out/moe_${arm}_$round.log"
    done; done
    cp /tmp/moe_new.py nanograph/models/moe.py
    [ "$(left)" -gt 120 ] || { echo "no time left for test_moe_gpu"; exit 0; }
    timeout "$(( $(left) - 5 ))" python3 -m pytest -q -p no:cacheprovider -rfE tests/gpu/test_moe_gpu.py \
      > "$out/test_moe_gpu.log" 2>&1; tail -3 "$out/test_moe_gpu.log" ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
