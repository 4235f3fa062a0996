#!/usr/bin/env bash
# For the next device session (prepared in stop 52): the Hopper extend (kernels/
# attention_hopper.py) in every GPU test and in the benches issue 18 names. From the repo root
# with NANOGRAPH_COMMIT exported, most important first:
#   bash docs/wip/stop53_calls.sh tests $OUT/r    # ~8 min: every tests/gpu file but TP, five
#     groups (run_device.sh tests-parallel): stop 52 ran only the attention kernel tests with it
#   bash docs/wip/stop53_calls.sh prefill $OUT/r  # ~8 min: qwen3-0.6b then qwen3-8b, 256..8192,
#     every graph arm and the fair peer (issue 18: <= 30 ms at 8k with every arm, tc_piecewise
#     never measured with it)
#   bash docs/wip/stop53_calls.sh attention $OUT/r  # ~4 min: bench attention, the hopper arm
#     beside Triton's and every SDPA backend (1 x 32k never measured with the extend kernel)
#   bash docs/wip/stop53_calls.sh pingpong $OUT/r   # ~6 min: hopper_pingpong.patch, tests + A/B
# PREDICTED: 0.6b 8k ~28.5-29 ms every arm (stop 52: 28.77 full on an H100); 8b 8k ~5% faster
# (attention ~19% of it, 1.24x faster there); 1 x 32k with 0.6b heads behind cuDNN by ~10%
# (the single-sequence prototype: 8.00 against 7.02 ms), with 8b heads within 5%.
set -uo pipefail
stage=$1 out=$(mkdir -p "$2" && cd "$2" && pwd)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv > "$out/gpu_$stage.txt"
case $stage in
  tests)
    bash benchmarks/run_device.sh tests-parallel "$out" ;;
  prefill)
    for m in qwen3-0.6b qwen3-8b; do
      timeout 270 python3 -m nanograph bench prefill --models $m --lengths 256,2048,8192 \
        --out "$out/prefill_$m.json" > "$out/prefill_$m.log" 2>&1
      grep -E "speedup|^  [a-z_]+ +[0-9]" "$out/prefill_$m.log" | head -n 12
    done ;;
  attention)
    timeout 280 python3 -m nanograph bench attention --out "$out/attention.json" \
      > "$out/attention.log" 2>&1; tail -n 20 "$out/attention.log" ;;
  pingpong)  # docs/wip/hopper_pingpong.patch (stop 52's helper; compiled only): its GPU tests,
    # then the extend cases of bench attention with it on and off (PREDICTED: +1-3% at 1 x 8192,
    # more at 1 x 32k if the gap to cuDNN there is GEMM / softmax overlap)
    git apply docs/wip/hopper_pingpong.patch || exit 2
    NANOGRAPH_HOPPER_PINGPONG=1 timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE \
      tests/gpu/test_kernels_attention.py -k "hopper or new_keys" > "$out/test_pingpong.log" 2>&1
    tail -n 3 "$out/test_pingpong.log"
    for p in 0 1 0 1; do
      NANOGRAPH_HOPPER_PINGPONG=$p timeout 100 python3 -m nanograph bench attention \
        --cases extend_1x8192,extend_1x32k,extend_1x8192_06b,extend_1x32k_06b \
        --out "$out/attention_pingpong$p.json" 2>&1 | grep -E "extend_" ; echo "== pingpong=$p"
    done
    git apply -R docs/wip/hopper_pingpong.patch ;;
  host)  # stop 53: the Hopper extend's host cost in eager launches (breakable prefill at 256
    # tokens: 5.61 against 3.43 ms without it, bench host); its GPU time at short prompts; the
    # clock sampler's cost to host-bound arms (bench prefill breakable 12.9 ms at 256 tokens)
    timeout 150 python3 -m nanograph bench attention \
      --cases extend_1x512_06b,extend_1x1024_06b,extend_1x2048_06b,extend_32x256 \
      --out "$out/attention_short.json" > "$out/attention_short.log" 2>&1
    grep -E "^ *extend_" "$out/attention_short.log"
    for t in 256 2048; do for h in 1 0; do
      NANOGRAPH_HOPPER_ATTENTION=$h timeout 120 python3 -m nanograph bench host --model qwen3-0.6b \
        --workload prefill --tokens $t --arms breakable --repeats 30 --top 30 \
        --out "$out/host_${t}_hopper$h.json" > "$out/host_${t}_hopper$h.log" 2>&1
      echo "tokens $t hopper=$h $(grep '^==.*per call' "$out/host_${t}_hopper$h.log")"
    done; done
    for c in 0 20; do
      timeout 150 python3 -m nanograph bench prefill --models qwen3-0.6b --lengths 256,2048 \
        --arms full,breakable,eager --peer-lengths '' --clock-period-ms $c \
        --out "$out/prefill_clock$c.json" > "$out/prefill_clock$c.log" 2>&1
      echo "clock period $c ms"; grep -E "^qwen3-0.6b (full|breakable|eager):" "$out/prefill_clock$c.log"
    done
    timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE tests/gpu/test_kernels_attention.py \
      -k "hopper or new_keys or extend" > "$out/test_attention.log" 2>&1
    tail -n 2 "$out/test_attention.log" ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
