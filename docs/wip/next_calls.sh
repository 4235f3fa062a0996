#!/usr/bin/env bash
# Device stages for a patched tree in ab/rope (stop 37: the rope patch) and the slow-state
# question (docs/wip/README.md says what each measures and what was predicted). Prepare on the
# development machine first:
#   rm -rf ab && mkdir -p ab/rope && git archive HEAD nanograph tests | tar x -C ab/rope \
#     && git apply --directory=ab/rope docs/wip/rope_in_attention_verify.patch
#   (ab/ is untracked: it travels with the tree; keep it out of commits)
# Then, with NANOGRAPH_COMMIT exported and the Triton cache unpacked:
#   bash docs/wip/next_calls.sh STAGE $OUT/r
# tests: the rope patch's GPU tests; floor: its A/B floor at batch 1 (and 0.6b at 8);
# spec: bench spec A/B; slow-state: slow_state_profile.py (per-kernel times in both states)
set -uo pipefail
call=$1 out=$(mkdir -p "$2" && cd "$2" && pwd)
root=$PWD rope=$PWD/ab/rope
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
[ -d "$rope/nanograph" ] || { echo "prepare ab/rope first (see the top of this file)" >&2; exit 2; }
cp nanograph/bench/floor.py "$rope/nanograph/bench/floor.py"
in_tree() {  # in_tree DIR COMMAND...: run from DIR with DIR's nanograph first on the path
  local d=$1; shift
  (cd "$d" && PYTHONPATH=$d "$@")
}
case $call in
  tests)
    groups=(test_kernels_attention.py test_runners_gpu.py test_spec_gpu.py test_moe_gpu.py
      "test_fused_decode_gpu.py test_graph_backends.py" test_hardening_gpu.py)
    for i in "${!groups[@]}"; do
      files=$(printf 'tests/gpu/%s ' ${groups[$i]})
      in_tree "$rope" timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider -rfE $files \
        > "$out/rope_tests_$i.log" 2>&1 &
    done
    wait
    for i in "${!groups[@]}"; do echo "== ${groups[$i]}"; grep -E "^(FAILED|ERROR)|passed|failed" \
      "$out/rope_tests_$i.log" | tail -6; done ;;
  floor)
    for case in ${FLOOR_CASES:-qwen3-0.6b:1:2 qwen3-8b:1:2 qwen3-0.6b:8:1}; do  # model:batch:runs
      IFS=: read -r m b n <<< "$case"; set -- "$m" "$b"; for i in $(seq "$n"); do
      for t in root rope; do
        d=$root; [ $t = rope ] && d=$rope; name="floor_$1_b$2_${t}_$i"
        in_tree "$d" timeout 60 python3 -m nanograph bench floor --model "$1" --decode-batch "$2" \
          --lengths 512 --graph full --repeats 20 --out "$out/$name.json" 2>&1 | grep -v "^INFO" \
          > "$out/$name.log"
        echo "$1 batch $2 $t $i: $(grep -o 'graph replays alone [0-9.]* ms' "$out/$name.log")"
      done; done; done | tee "$out/floor_ab.log" ;;
  slow-state)
    cp docs/wip/slow_state_profile.py /tmp/slow_state_profile.py
    for flag in "" --no-pdl; do  # stop 37 ran the first only
      echo "== slow_state_profile.py qwen3-30b-a3b $flag"
      in_tree "$root" timeout 150 python3 /tmp/slow_state_profile.py qwen3-30b-a3b $flag 2>&1 \
        | grep -v "^INFO" | tail -40
    done | tee "$out/slow_state.log" ;;
  spec)
    for i in $(seq "${SPEC_RUNS:-2}"); do for t in root rope; do
      d=$root; [ $t = rope ] && d=$rope
      in_tree "$d" timeout 100 python3 -m nanograph bench spec --target qwen3-8b --arms ngram:4 \
        --batches 1,4 --repeats 5 --out "$out/spec_${t}_$i.json" 2>&1 | grep -v "^INFO" \
        > "$out/spec_${t}_$i.log"
      echo "spec $t $i: $(grep -iE 'verify.*decode|ratio' "$out/spec_${t}_$i.log" | head -3)"
    done; done | tee "$out/spec_ab.log" ;;
  *) echo "unknown stage $call (tests, floor, spec, slow-state)" >&2; exit 2 ;;
esac
