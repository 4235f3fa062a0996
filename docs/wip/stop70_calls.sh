#!/usr/bin/env bash
# Stop 70's device calls, from the repo root with NANOGRAPH_COMMIT exported and the wheels of
# ../.library/device/README.md in .whl (carry [".whl"]; xgrammar for structured outputs):
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#     --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit
#   LIMIT=580 bash docs/wip/stop70_calls.sh first $OUT/f; cd $OUT && tar czf f.tgz f
#   LIMIT=500 bash docs/wip/stop70_calls.sh second $OUT/s; cd $OUT && tar czf s.tgz s
# first: the tests/gpu files whose code changed since stop 69's run (structured outputs'
#   engine path, never run on a GPU; the step's guarded penalties; the native MoE loop over
#   the experts that have rows), three processes; then the native loop against 5d05fba's,
#   alternating twice (bench prefill, breakable with eager beside, qwen3-30b-a3b, 256 tokens).
# PREDICTED (native loop): dummy routing gives ~66 of 128 experts rows a layer at 256 tokens;
#   4 splits a layer of 128 views -> ~66: ~2 ms of host time of ~53 ms in both arms, so
#   breakable ~4% shorter and eager ~3%: the ratio 1.49 -> ~1.51 on the machine that gave 1.49.
set -uo pipefail
stage=$1 out=$(mkdir -p "$2" && cd "$2" && pwd)
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH=${PYTHONPATH:-$PWD}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
begin=$(date +%s)
left() { echo $((${LIMIT:-570} - ($(date +%s) - begin))); }
case $stage in
  first)
    groups=("test_sampling_gpu.py test_hardening_gpu.py test_engine_gpu.py test_front_gpu.py test_prefix_gpu.py"
      "test_moe_gpu.py" "test_spec_gpu.py")
    for i in "${!groups[@]}"; do
      timeout "${TEST_TIMEOUT:-250}" python3 -m pytest -q -p no:cacheprovider --durations=5 -rfE \
        $(printf 'tests/gpu/%s ' ${groups[$i]}) > "$out/gpu_tests_$i.log" 2>&1 &
    done
    wait; for f in "$out"/gpu_tests_*.log; do grep -E "passed|failed|error" "$f" | tail -3; done
    echo "tests done at $(( $(date +%s) - begin )) s"
    bash "$0" moeab "$out" ;;
  moeab)  # the loop over experts with rows (this tree) against 5d05fba's loop over all experts
    cp nanograph/models/moe.py /tmp/moe_new.py
    git show 5d05fba:nanograph/models/moe.py > /tmp/moe_old.py || { echo "no 5d05fba here"; exit 0; }
    for round in 1 2; do for arm in new old; do
      [ "$(left)" -gt 75 ] || { echo "no time left for $arm $round"; break 2; }
      cp /tmp/moe_$arm.py nanograph/models/moe.py
      timeout "$(left)" python3 -m nanograph bench prefill --models "${MOE_MODELS:-qwen3-30b-a3b}" \
        --lengths 256 --arms breakable --moe-backend torch_native --peer-lengths '' --repeats 9 \
        --eager-beside --out "$out/moe_${arm}_$round.json" > "$out/moe_${arm}_$round.log" 2>&1
      echo "$arm $round rc=$? at $(( $(date +%s) - begin )) s"; grep -E "paired|: 256=" "$out/moe_${arm}_$round.log"
    done; done
    cp /tmp/moe_new.py nanograph/models/moe.py ;;
  second)  # the structured outputs' read-ahead: its GPU tests, then the probe alternating
    for f in test_sampling_gpu test_engine_gpu test_hardening_gpu test_front_gpu; do
      timeout "${TEST_TIMEOUT:-200}" python3 -m pytest -q -p no:cacheprovider -rfE \
        "tests/gpu/$f.py" > "$out/$f.log" 2>&1 &
    done
    wait; for f in "$out"/test_*.log; do echo "$f: $(tail -n 1 "$f")"; done
    echo "tests done at $(( $(date +%s) - begin )) s"
    bash "$0" structab "$out" ;;
  structab)  # this tree's engine.py (the read-ahead) against 5d05fba's (a paused overlap)
    # PREDICTED: at batch 1 the regex arm goes from ~0.8x of plain to ~0.95x (the step's host
    #   work hidden behind the forward again); at batch 16 less (a longer forward, the same
    #   host work): ~0.9 -> ~0.97.
    # (pin: 5d05fba's engine.py, which reads a form's token before the next launch, with this
    #  tree's structured.py, whose copies do not block; old: both files of 5d05fba)
    for f in engine structured; do
      cp nanograph/engine/$f.py /tmp/${f}_new.py
      git show 5d05fba:nanograph/engine/$f.py > /tmp/${f}_old.py || { echo "no 5d05fba"; exit 0; }
    done
    cp /tmp/engine_old.py /tmp/engine_pin.py; cp /tmp/structured_new.py /tmp/structured_pin.py
    for round in 1 2; do for arm in ${ARMS:-new old}; do
      [ "$(left)" -gt 60 ] || { echo "no time left for $arm $round"; break 2; }
      cp /tmp/engine_$arm.py nanograph/engine/engine.py
      cp /tmp/structured_$arm.py nanograph/engine/structured.py
      timeout "$(left)" python3 docs/wip/structured_overlap_probe.py \
        --out "$out/structured_${arm}_$round.json" > "$out/structured_${arm}_$round.log" 2>&1
      echo "$arm $round rc=$? at $(( $(date +%s) - begin )) s"; grep -E "tok/s|over" "$out/structured_${arm}_$round.log"
    done; done
    cp /tmp/engine_new.py nanograph/engine/engine.py
    cp /tmp/structured_new.py nanograph/engine/structured.py ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
