#!/usr/bin/env bash
# Stop 60 prepared these after its device time ran out; none has run yet.
# From the repo root with NANOGRAPH_COMMIT exported:
#   bash docs/wip/stop60_calls.sh fold $OUT/f      # ~4 min, any GPU: the few-row products taking
#     the norms in (rows_norm_fold.patch) against the unfused chain, qwen3-0.6b and
#     qwen3-8b at 2 / 4 / 8 rows (rows_norm_chain_probe.py); the patch's GPU-free tests first
#   bash docs/wip/stop60_calls.sh fold_engine $OUT/e  # ~7 min, any GPU: the patch in the engine:
#     its GPU test (fused rows against unfused, greedy agreement) and bench decode full against
#     full:fused_rows at batch 2 / 4 / 8 on qwen3-0.6b and qwen3-8b (run only if fold gains)
#   bash docs/wip/stop60_calls.sh compiles $OUT/c  # ~5 min, an 80 GB GPU: Triton variants compiled
#     or loaded inside each runner's capture (capture_compiles_probe.py)
# PREDICTED for fold (H100): fused 4-7% under unfused on qwen3-0.6b, 1-2% on qwen3-8b (the
# upper bound, no norm kernels at all: 10-11% and 2-3%); final rows within ~2%.
# PREDICTED for fold_engine: greedy agreement > 0.9; qwen3-0.6b batch 2-8 +3-6% tok/s, qwen3-8b
# +1-2%; batch 1 unchanged (the one-row fused path).
# PREDICTED for compiles: none on the dense and speculative engines (since 286953c); the
# sorted MoE kernels' row-block variants inside qwen3-30b-a3b's prefill captures.
set -uo pipefail
stage=$1 out=$(mkdir -p "$2" && cd "$2" && pwd)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv > "$out/gpu_$stage.txt"
case $stage in
  fold)
    git apply docs/wip/rows_norm_fold.patch || exit 2
    TRITON_INTERPRET=1 timeout 300 python3 -m pytest -q -x tests/test_kernels_triton.py \
      -k gemm_rows > "$out/fold_tests.log" 2>&1; tail -1 "$out/fold_tests.log"
    timeout 400 python3 docs/wip/rows_norm_chain_probe.py qwen3-0.6b,qwen3-8b 2,4,8 \
      > "$out/fold.log" 2>&1; grep rows "$out/fold.log"
    git apply -R docs/wip/rows_norm_fold.patch ;;
  fold_engine)
    git apply docs/wip/rows_norm_fold.patch || exit 2
    timeout 240 python3 -m pytest -q -x tests/gpu/test_fused_decode_gpu.py -s \
      > "$out/fold_gpu_tests.log" 2>&1; grep -E "agreement|passed|failed" "$out/fold_gpu_tests.log"
    timeout 400 python3 -m nanograph bench decode --models qwen3-0.6b,qwen3-8b \
      --arms full,full:fused_rows --batches 2,4,8 --new-tokens 128 --repeats 3 \
      --out "$out/decode_fold.json" > "$out/decode_fold.log" 2>&1
    grep -E "decode=|roofline" "$out/decode_fold.log" | tail -20
    git apply -R docs/wip/rows_norm_fold.patch ;;
  compiles)
    timeout 560 python3 docs/wip/capture_compiles_probe.py > "$out/compiles.log" 2>&1
    grep -v Warning "$out/compiles.log" | tail -40 ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
