#!/usr/bin/env bash
# stop 43 call 2: GPU tests of the tree (argmax kernel, float32 logits from the GEMV, LM head
# tiles, numpy token rows, vector vocabulary check), then A/B against ab/main (fd88f05).
set -uo pipefail
out=$(mkdir -p "$1" && cd "$1" && pwd) root=$PWD
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p ~/.triton && tar xzf .triton_cache.tgz -C ~/.triton
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv > "$out/gpu.txt"
G=tests/gpu
t() { local i=$1; shift; timeout 290 python3 -m pytest -q -p no:cacheprovider "$@" > "$out/t$i.log" 2>&1; }
t 0 $G/test_gemv_gpu.py $G/test_sampling_gpu.py $G/test_fused_decode_gpu.py &
t 1 $G/test_spec_gpu.py &
t 2 $G/test_engine_gpu.py $G/test_hardening_gpu.py $G/test_front_gpu.py &
t 3 $G/test_moe_gpu.py $G/test_graph_backends.py &
t 4 $G/test_runners_gpu.py $G/test_prefix_gpu.py $G/test_live_capture_gpu.py $G/test_graph_memory.py &
wait
for i in 0 1 2 3 4; do echo "t$i: $(tail -1 $out/t$i.log)"; grep -E "^(FAILED|ERROR)" "$out/t$i.log" | head -5; done
dec() {  # dir label model rep
  (cd "$1" && PYTHONPATH=$1 timeout 150 python3 -m nanograph bench decode --models "$3" --arms full \
    --batches 1 --repeats 3 --out "$out/dec_$3_$2_$4.json" > "$out/dec_$3_$2_$4.log" 2>&1)
  echo "dec $3 $2 $4: $(grep -o 'decode=full: .*' "$out/dec_$3_$2_$4.log")"
}
pre() {
  (cd "$1" && PYTHONPATH=$1 timeout 150 python3 -m nanograph bench prefill --models qwen3-0.6b \
    --lengths 8192 --arms full --peer-lengths '' --repeats 9 --out "$out/pre_$2_$3.json" \
    > "$out/pre_$2_$3.log" 2>&1)
  echo "pre $2 $3: $(grep -o 'qwen3-0.6b full: .*' "$out/pre_$2_$3.log")"
}
for i in 1 2; do
  dec "$root/ab/main" main qwen3-0.6b $i; dec "$root" new qwen3-0.6b $i
done | tee "$out/ab.log"
for i in 1 2; do pre "$root/ab/main" main $i; pre "$root" new $i; done | tee -a "$out/ab.log"
