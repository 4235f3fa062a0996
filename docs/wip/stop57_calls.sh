#!/usr/bin/env bash
# Stop 57 ran diag, att and long here (benchmarks/results/h100/stop57_*/COMMAND.md) and landed
# the one-row decode's longer slices (5604227); stop 58 ran tests and slices_ab at 311ec69
# (benchmarks/results/h100/stop58_311ec69); stop 59 ran lean (onerow_lean.patch, landed as
# bd9bd52; the stage is gone with the patch, see 76252ff), tests with it, and stages
# (benchmarks/results/h100/stop59_bd9bd52) and host (the batch-1 engine step is GPU-bound).
# Next: h200 (issue 18's figures on an H200 with the Hopper extend, only ever measured on
# H100s; guarded: it exits on any other GPU unless ANY_GPU=1).
# From the repo root with NANOGRAPH_COMMIT exported:
#   bash docs/wip/stop57_calls.sh h200 $OUT/h    # ~8 min, on an H200 only: 0.6b prefill,
#     every arm and the peer, 256 / 2048 / 8192; attention (Hopper extend against SDPA)
#   bash docs/wip/stop57_calls.sh tests $OUT/t   # ~5 min: every tests/gpu file but TP
#   bash docs/wip/stop57_calls.sh att $OUT/a     # ~8 min, any GPU: one-row attention slices
#   bash docs/wip/stop57_calls.sh long $OUT/l    # ~6 min, any GPU: one-row slices at 1k-16k
#     tokens (qkv_o_graph_sweep.py --att-long), bench decode qwen3-8b / 0.6b full 1, 8, 32
#   bash docs/wip/stop57_calls.sh slices_ab $OUT/s  # ~7 min: 5604227's slices on qwen3-8b
#     (batch 1 and 4, prompts 2048 / 4096) and 30b-a3b, alternating with them off
#   bash docs/wip/stop57_calls.sh ncu $OUT/n      # ~3 min, a Firecracker machine: Nsight Compute
#     on the one-row decode attention (qwen3-0.6b shapes; NCU_SHAPES= for qwen3-8b's)
#   bash docs/wip/stop57_calls.sh stages $OUT/g   # ~4 min, any GPU: the one-row decode's stages
#     left out one at a time in a graph of layers (onerow_stages.patch; SHAPE= for qwen3-8b's)
#   PATCH=docs/wip/X.patch bash docs/wip/stop57_calls.sh tests $OUT/t  # with a patch applied
#   bash docs/wip/stop57_calls.sh host $OUT/o     # ~2 min, any GPU: the engine's host time a
#     batch-1 decode step of qwen3-0.6b against the graph's (step_host_time.py; ran in stop 59)
#   bash docs/wip/stop57_calls.sh diag $OUT/d    # ~5 min, any GPU: where the batch-1 decode
#     graph's time goes, per kernel of a layer (decode_breakdown.py, qwen3-8b and 0.6b), and
#     qwen3-8b's gate/up and down tiles swept inside a graph (qkv_o_graph_sweep.py --mlp)
# PREDICTED for host (H100, bd9bd52: graph 0.683 ms, engine step 0.827): the host's work a
# step outside the read's wait ~0.2-0.3 ms, so the host keeps ahead and the read waits
# ~0.5 ms a step; runner.forward + argmax back to back ~0.80 ms (the graph + the eager LM head).
# PREDICTED for stages (0.6b shapes, the attention ~9.3 us a layer of the graph): an empty
# kernel ~7 us a layer less than the default, returning after the wait ~5 less, no key loop
# ~1.5 less, no merge (32) ~2 less, no L2 prefetch ~+0.5 more, no rope + KV store ~0.5 less.
# PREDICTED (H100, stops 55-56: full 2.08 / 5.55 / 28.52 ms, breakable 2.31 at 256): on the
# H200 (more bandwidth, a different host) the 8192 figures ~26-28 ms for every graph arm.
set -uo pipefail
stage=$1 out=$(mkdir -p "$2" && cd "$2" && pwd)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv > "$out/gpu_$stage.txt"
case $stage in
  tests)  # PATCH=docs/wip/X.patch: with that patch applied
    [ -n "${PATCH:-}" ] && git apply "$PATCH"
    bash benchmarks/run_device.sh tests-parallel "$out"
    [ -n "${PATCH:-}" ] && git apply -R "$PATCH" ;;
  h200)  # the Hopper extend was only ever measured on H100s (stops 52, 53, 55)
    grep -q H200 "$out/gpu_$stage.txt" || [ -n "${ANY_GPU:-}" ] || { echo "not an H200"; exit 2; }
    timeout 300 python3 -m nanograph bench prefill --models qwen3-0.6b --lengths 256,2048,8192 \
      --out "$out/prefill_06b.json" > "$out/prefill_06b.log" 2>&1
    grep -E "^qwen3-0.6b [a-z_]+:" "$out/prefill_06b.log"
    timeout 200 python3 -m nanograph bench attention --cases \
      extend_1x8192,extend_1x32k,extend_1x8192_06b,extend_1x32k_06b,extend_32x256 \
      --out "$out/attention.json" > "$out/attention.log" 2>&1
    grep -E "^ *extend_" "$out/attention.log" ;;
  diag)
    timeout 240 python3 docs/wip/decode_breakdown.py "$out" qwen3-8b,qwen3-0.6b \
      > "$out/breakdown.log" 2>&1
    grep -v "^ *0.00 us" "$out/breakdown.log" | tail -60
    timeout 300 python3 docs/wip/qkv_o_graph_sweep.py --mlp > "$out/mlp_sweep.log" 2>&1
    cat "$out/mlp_sweep.log" | grep -v Warning ;;
  att)  # the one-row decode attention's slices in a graph of layers (diag found it 9.3-9.7 us)
    W=docs/wip/qkv_o_graph_sweep.py
    timeout 200 python3 $W --att > "$out/att_8b.log" 2>&1; grep -v Warn "$out/att_8b.log"
    timeout 200 python3 $W --att --06b > "$out/att_06b.log" 2>&1; grep -v Warn "$out/att_06b.log"
    timeout 150 python3 $W --att --context 4095 > "$out/att_8b_4k.log" 2>&1
    grep -v Warn "$out/att_8b_4k.log" ;;
  long)  # key blocks a one-row slice at long contexts; this H100's batch-1 decode roofline
    for ctx in ${CTXS:-4095 2047 8191 1023 767 16383}; do
      timeout 150 python3 docs/wip/qkv_o_graph_sweep.py --att-long --context $ctx \
        > "$out/long_$ctx.log" 2>&1
      echo "== $ctx"; grep "us a layer" "$out/long_$ctx.log" \
        | sed -E 's/AttentionTiles.*(min_split_blocks=[0-9]+).*(min_slices=[0-9]+)/\1 \2/'
    done
    [ -n "${NO_DECODE:-}" ] && exit 0
    timeout 240 python3 -m nanograph bench decode --models qwen3-8b,qwen3-0.6b --arms full \
      --batches 1,8,32 --out "$out/decode.json" > "$out/decode.log" 2>&1
    tail -25 "$out/decode.log" ;;
  ncu)  # where the one-row decode attention's ~9.5 us a layer go (stop 45's command, first
    # run in stop 58): Nsight Compute on its graph nodes (each alone: no PDL), qwen3-0.6b shapes
    timeout 200 ncu --clock-control none --graph-profiling node -k regex:_paged_attention_kernel \
      --launch-skip 36 --launch-count 4 --set full --import-source yes -o "$out/onerow" \
      python3 docs/wip/qkv_o_graph_sweep.py --ncu ${NCU_SHAPES---06b} > "$out/ncu.log" 2>&1
    tail -4 "$out/ncu.log"
    ncu -i "$out/onerow.ncu-rep" --page details > "$out/details.txt" 2>&1
    ncu -i "$out/onerow.ncu-rep" --page source --print-source sass --csv > "$out/sass.csv" 2>&1
    grep -E "Duration|Elapsed Cycles|Registers|Grid Size|Block Size|Achieved Occ|Warp Cycles|DRAM Th|Issued Ipc" \
      "$out/details.txt" | head -40 ;;
  stages)  # what each stage of the one-row decode costs in a graph of layers (ncu found it a
    # chain of round trips): onerow_stages.patch's SKIP bits; qwen3-0.6b shapes (SHAPE= for
    # 8b's)
    git apply docs/wip/onerow_stages.patch
    timeout 270 python3 docs/wip/qkv_o_graph_sweep.py --att-stages ${SHAPE---06b} \
      > "$out/stages${SHAPE---06b}.log" 2>&1
    git apply -R docs/wip/onerow_stages.patch
    grep -v Warn "$out/stages${SHAPE---06b}.log" ;;
  host)  # the engine's host time a step against the GPU's (bench floor: graph 0.683 ms alone,
    # the engine's step 0.827 on an H100)
    timeout 150 python3 docs/wip/step_host_time.py qwen3-0.6b 256 > "$out/host_06b.log" 2>&1
    grep -v Warn "$out/host_06b.log" | tail -34 ;;
  slices_ab)  # 5604227's one-row slices past 512 tokens on the models not measured with them
    # ("off": docs/wip/onerow_slices_off.patch puts back the old (1, 1)); ~7 min
    B="python3 -m nanograph bench decode --arms full --new-tokens 128 --repeats 3"
    for tree in off on off on; do
      [ $tree = off ] && git apply docs/wip/onerow_slices_off.patch
      for L in 2048 4096; do
        timeout 100 $B --models qwen3-8b --batches 1,4 --prompt-len $L \
          --out "$out/8b_${L}_$tree.json" 2>&1 | grep "decode=full"
      done
      timeout 100 $B --models qwen3-30b-a3b --batches 1 --prompt-len 2048 \
        --out "$out/30b_2048_$tree.json" 2>&1 | grep "decode=full"
      [ $tree = off ] && git apply -R docs/wip/onerow_slices_off.patch
      echo "== $tree"
    done ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
