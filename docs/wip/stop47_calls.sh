#!/usr/bin/env bash
# The next device session's calls (stops 46 and 47 had no device; docs/wip/HISTORY.md, "Where
# stop 46 left it" and "Where stop 47 left it", say what each answers). One stage a call, each under 10 minutes; from the repo
# root, NANOGRAPH_COMMIT exported, the Triton cache unpacked (mkdir -p ~/.triton && tar xzf
# .triton_cache.tgz -C ~/.triton):
#   bash docs/wip/stop47_calls.sh tests $OUT/r   # ~6 min: what stops 44-46 changed, on main
#   bash docs/wip/stop47_calls.sh sweep $OUT/r   # ~6 min: qkv_o_graph_sweep.py, then --30b
#   bash docs/wip/stop47_calls.sh gemm $OUT/r    # ~4 min: prefill_gemm_proto.py
#   bash docs/wip/stop47_calls.sh cudnn $OUT/r   # ~2 min: cudnn_prefill_proto.py
#     (in gemm's call if gemm took under 6 minutes, else a call of its own)
#   bash docs/wip/stop47_calls.sh mxfp4 $OUT/r   # ~8 min: gpt-oss' experts kept MXFP4
#   bash docs/wip/stop47_calls.sh mxfp4_120b $OUT/r   # ~9 min: gpt-oss-120b on one H200
#   bash docs/wip/stop47_calls.sh mxfp4_coverage $OUT/r   # ~6 min: full/breakable/tc_piecewise
#     (both after tests: test_moe_gpu.py holds its GPU tests). Predicted, gpt-oss-20b batch 1:
#     347 tok/s in bf16 (59% of 584); MXFP4 experts are 1.27 of its 7.4 GB a token in bf16
#     (roofline ~1,100 tok/s) but each code costs ~6 integer/float operations to decode, ~0.5
#     ms a step of ALU at batch 1: 500-650 tok/s. gpt-oss-120b fits one H200 only this way.
#   bash docs/wip/stop47_calls.sh moe_sweep $OUT/r   # ~6 min: moe_prefill_sweep.py (stop 48)
#   bash docs/wip/stop47_calls.sh oss $OUT/r   # ~7 min: MXFP4 backends test, tc_piecewise, 120b
# They add up to ~45 minutes, more than a session's 30: in this order of value, stop where the
# time ends: tests (every CUDA change since stop 44, MXFP4 included), mxfp4, gemm + cudnn
# (issue 18's 30 ms), mxfp4_120b, mxfp4_coverage, sweep.
# Then tar $OUT/r into one file (only a few files come back from $OUT).
set -uo pipefail
stage=$1 out=$(mkdir -p "$2" && cd "$2" && pwd)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
case $stage in
  tests)  # parallel groups: correctness does not mind the contention; no timing here
    groups=(test_moe_gpu.py test_gemv_gpu.py test_kernels_attention.py
      "test_engine_gpu.py test_hardening_gpu.py")
    for i in "${!groups[@]}"; do
      files=$(printf 'tests/gpu/%s ' ${groups[$i]})
      timeout 500 python3 -m pytest -q -p no:cacheprovider -rfE $files > "$out/tests_$i.log" 2>&1 &
    done
    wait
    for i in "${!groups[@]}"; do
      echo "== ${groups[$i]}"; grep -E "^(FAILED|ERROR)|passed|failed" "$out/tests_$i.log" | tail -6
    done ;;
  sweep)
    timeout 280 python3 docs/wip/qkv_o_graph_sweep.py > "$out/sweep_8b.log" 2>&1
    tail -n 25 "$out/sweep_8b.log"
    timeout 280 python3 docs/wip/qkv_o_graph_sweep.py --30b > "$out/sweep_30b.log" 2>&1
    tail -n 25 "$out/sweep_30b.log" ;;
  gemm)
    timeout 560 python3 docs/wip/prefill_gemm_proto.py --out "$out/gemm.json" 2>&1 \
      | grep -v -i warn | tee "$out/gemm.log" | tail -n 30 ;;
  mxfp4)  # the experts alone (bench gemv), then gpt-oss-20b decode and prefill, both forms
    timeout 120 python3 -m nanograph bench gemv --models gpt-oss-20b \
      --out "$out/gemv_20b.json" > "$out/gemv_20b.log" 2>&1; grep experts "$out/gemv_20b.log"
    for q in none mxfp4; do
      flag=$([ $q = mxfp4 ] && echo "--quantization mxfp4")
      timeout 150 python3 -m nanograph bench decode --models gpt-oss-20b --arms full \
        --batches 1,8 --moe-backend triton $flag --out "$out/decode_20b_$q.json" \
        > "$out/decode_20b_$q.log" 2>&1; tail -n 3 "$out/decode_20b_$q.log"
      timeout 120 python3 -m nanograph bench prefill --models gpt-oss-20b --arms full \
        --lengths 256,2048 --peer-lengths '' $flag --out "$out/prefill_20b_$q.json" \
        > "$out/prefill_20b_$q.log" 2>&1; tail -n 4 "$out/prefill_20b_$q.log"
    done ;;
  mxfp4_120b)
    # the reference's headline row on one H200: gpt-oss-120b, one request, one output token,
    # chunk 8192, prefill over eager (theirs, TP4 on 4xGB300: full 1.93x, breakable 1.70x)
    timeout 420 python3 -m nanograph bench prefill --models gpt-oss-120b \
      --arms full,breakable,eager --lengths 2048,8192 --quantization mxfp4 --peer-lengths '' \
      --out "$out/prefill_120b.json" > "$out/prefill_120b.log" 2>&1
    tail -n 8 "$out/prefill_120b.log"
    timeout 150 python3 -m nanograph bench decode --models gpt-oss-120b --arms full \
      --batches 1 --quantization mxfp4 --out "$out/decode_120b.json" \
      > "$out/decode_120b.log" 2>&1; tail -n 3 "$out/decode_120b.log" ;;
  mxfp4_coverage)  # every graph backend holding the packed experts, token-identical to eager
    timeout 500 python3 -m nanograph bench coverage --models gpt-oss-20b --moe-backends triton \
      --quantization mxfp4 --out "$out/coverage_mxfp4.json" > "$out/coverage_mxfp4.log" 2>&1
    tail -n 12 "$out/coverage_mxfp4.log" ;;
  moe_sweep)  # stop 48: the sorted MoE GEMMs' tiles at prefill sizes, MXFP4 through
    # tl.dot_scaled too (moe_prefill.patch, applied to the device copy of the tree)
    git apply docs/wip/moe_prefill.patch || exit 2
    timeout 540 python3 docs/wip/moe_prefill_sweep.py --out "$out/moe_sweep.json" 2>&1 \
      | grep -v -i warn | tee "$out/moe_sweep.log" | grep -E "^[a-z]|default" ;;
  oss)  # stop 48: MXFP4 experts under every backend in float32; dense gpt-oss-20b under
    # tc_piecewise in bf16 (stop 47's MXFP4 mismatch: rounding or the packed experts?);
    # gpt-oss-120b prefill over eager (stop 47's breakable arm ran out of KV memory)
    timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE tests/gpu/test_moe_gpu.py \
      -k mxfp4_engine > "$out/test_mxfp4_backends.log" 2>&1; tail -n 3 "$out/test_mxfp4_backends.log"
    timeout 150 python3 -m nanograph bench coverage --models gpt-oss-20b --moe-backends triton \
      --backends tc_piecewise --out "$out/coverage_dense_tc.json" > "$out/coverage_dense_tc.log" 2>&1
    tail -n 4 "$out/coverage_dense_tc.log"
    timeout 240 python3 -m nanograph bench prefill --models gpt-oss-120b --arms full,eager \
      --lengths 2048,8192 --quantization mxfp4 --peer-lengths '' \
      --out "$out/prefill_120b.json" > "$out/prefill_120b.log" 2>&1
    tail -n 8 "$out/prefill_120b.log" ;;
  cudnn)
    timeout 300 python3 docs/wip/cudnn_prefill_proto.py --out "$out/cudnn.json" 2>&1 \
      | grep -v -i warn | tee "$out/cudnn.log" | tail -n 30 ;;
  *) echo "unknown stage $stage (tests, sweep, gemm, cudnn, mxfp4, mxfp4_120b," \
       "mxfp4_coverage, moe_sweep, oss)" >&2
     exit 2 ;;
esac
