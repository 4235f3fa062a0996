#!/usr/bin/env bash
# Stop 78's device calls, from the repo root with NANOGRAPH_COMMIT exported (the tree's hash,
# written out) and the Triton cache unpacked:
#   bash docs/wip/stop78_calls.sh aims $OUT/a   # ~4 min, an H200 if one comes (an H100's
#     figures are its own roofline's): batch-1 decode of qwen3-30b-a3b (issue 15's 60%, not
#     measured since stop 68's 58%, before 5b5c4a7 fused MoE layers at any hidden size),
#     qwen3-0.6b and qwen3-8b (issue 18), one process a model so a timeout keeps the others
#   bash docs/wip/stop78_calls.sh split $OUT/s  # ~3 min, any H100/H200: gpt-oss-20b's native
#     breakable prefill at 256 with native_split_with_sizes.patch (the loop's four splits a
#     layer without Tensor.split's Python wrapper: ~4 us a call on the CPU machine; predicted
#     ~1% of the breakable arm, ~0.4 ms of 28) against the tree, alternating three times
set -uo pipefail
stage=$1 out=$(mkdir -p "$2" && cd "$2" && pwd)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
bench() { local name=$1; shift; timeout "${LIMIT:-120}" python3 -m nanograph bench "$@" \
  --out "$out/$name.json" > "$out/$name.log" 2>&1; grep -v "^INFO" "$out/$name.log" | tail -4; }
case $stage in
  aims)
    for m in qwen3-30b-a3b qwen3-0.6b qwen3-8b; do
      bench "decode_b1_$m" decode --models $m --arms full --batches 1 --repeats 3
    done ;;
  split)
    p=docs/wip/native_split_with_sizes.patch
    args=(prefill --models gpt-oss-20b --lengths 256 --arms breakable --moe-backend torch_native
      --peer-lengths '' --repeats 15 --eager-beside)
    for round in 1 2 3; do
      git apply $p && bench "split$round" "${args[@]}"; git apply -R $p
      bench "base$round" "${args[@]}"
    done
    grep -H "paired:" "$out"/*.log ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
