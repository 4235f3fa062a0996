#!/usr/bin/env bash
# What the H200 runs for nanograph: `bash benchmarks/run_device.sh STAGE OUTDIR`.
# Stages: tests (tests/gpu), verify (tests, attention, decode full), check (tests, a host
#   profile of breakable prefill, prefill arms on qwen3-0.6b), bench-prefill,
#   bench-decode, bench-misc (build, memory, size),
#   report (the foundation issue's qwen3-8b eager figures, and the kernel floor),
#   remaining-decode, remaining-build (what earlier sessions could not fit: decode arms
#   breakable/tc_piecewise at batch 32/128 and on qwen3-0.6b, the transformers generate peer,
#   and the build bench on the default ladder), rerun (figures older than cd44b17's changes),
#   sweep-32k (tile/split sweep of the 1 x 32k decode), sweep-1x512 (the batch-1 decode),
#   ncu-32k (hardware counters of the 1 x 32k decode launch), gemv (the decode GEMV vs cuBLAS),
#   sweep-small (decode attention tiles at batch 1 and 8), hardening (start-up with cold and
#   warm kernel caches, GPU tests), prefix (prefix caching: its GPU test under each prefill
#   backend, then bench prefix on qwen3-8b dummy), moe (MoE models: GPU tests, decode
#   roofline on qwen3-30b-a3b, native-MoE prefill breakable vs eager), moe-decode (the MoE
#   layer GPU tests, the kernel floor and tokens/s of a qwen3-30b-a3b decode step), moe-sweep
#   (that step's products one at a time, with every tile), moe-coverage (the
#   `bench coverage` table: model x MoE backend x graph backend x path), serve (`bench serve`
#   against `nanograph serve`: arms, request-rate sweeps and the offline comparisons; needs the
#   wheels of benchmarks/serve_wheels.txt in $SERVE_WHEELS, default .whl, carried),
#   fair-peer (prefill against the transformers peer with logits_to_keep=1 and its recorded
#   attention, and the decode roofline from this device's measured copy bandwidth),
#   tp (tensor parallelism, on nvidia-h200-x2: GPU tests, then decode and prefill on qwen3-8b
#   with TP=1 and TP=2 side by side), capture (serve while capturing: its GPU tests, then the
#   capture modes side by side on 0.6b and 8b), spec (speculative decoding: its GPU tests,
#   then `bench spec` on qwen3-8b), serve-gil (issue 13: the server at saturation with the
#   default GIL switch interval and with 0.2 ms), serve-process (issue 13's other arm: the same
#   saturation point with the engine in a thread and in its own process), fusion (the fused batch-1 decode: its GPU tests and the
#   GEMV's, then decode fused vs unfused on qwen3-0.6b and qwen3-8b with kernels per step),
#   tests-parallel (tests/gpu but tensor parallelism, five pytest processes at once),
#   serve-saturation (issue 13: 0.6b saturation at 128 and 512 prompts, with per-process CPU),
#   ab-floor (this tree's decode graph replay time against another commit's, alternating),
#   prefill-long (extend attention vs SDPA at 8k / 32k, the 8k prefill's kernels and peer),
#   ab-attention (this tree's attention kernel against another commit's, alternating),
#   prefill-verify (the long-prompt attention's GPU tests, then a model's prefill table).
# Run from the repo root; logs and JSON land in OUTDIR (copy them to benchmarks/results/).
# Export NANOGRAPH_COMMIT=<short hash> first: the device copy's .git can be stale.
set -uo pipefail
stage=$1 out=${2:-benchmarks/results}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv | tee "$out/device.txt"
case $stage in
  tests)
    python3 -m pytest -q -s -p no:cacheprovider tests/gpu 2>&1 | tee "$out/gpu_tests.log" ;;
  verify)  # ~9 min: a session's first call after CUDA-path changes, plus the figures they move
    python3 -m pytest -q -p no:cacheprovider tests/gpu > "$out/gpu_tests.log" 2>&1
    tail -1 "$out/gpu_tests.log"
    python3 -m nanograph bench attention --out "$out/attention.json" 2>&1 | tee "$out/attention.log"
    python3 -m nanograph bench decode --models qwen3-0.6b,qwen3-8b --arms full --batches 1,32,128 \
      --repeats 3 --out "$out/decode_full.json" 2>&1 | tee "$out/decode_full.log"
    # the GPU time of one 0.6b decode step: wall time per step minus this is host overhead
    python3 -m nanograph bench floor --model qwen3-0.6b --lengths 512 --decode-batch 1 \
      --out "$out/floor_decode_06b.json" 2>&1 | tee "$out/floor_decode_06b.log" ;;
  check)  # ~9 min: a session's first call after CUDA-path changes, host profile, prefill arms
    # PYTEST_ARGS narrows the run (e.g. -k "not bf16_greedy"), TEST_TIMEOUT bounds it
    timeout "${TEST_TIMEOUT:-400}" python3 -m pytest -q -p no:cacheprovider --durations=12 -rfE \
      tests/gpu ${PYTEST_ARGS:-} > "$out/gpu_tests.log" 2>&1
    tail -22 "$out/gpu_tests.log"
    # HOST_ARGS picks the profiled workload, e.g. "--workload decode --arms full --batch 1"
    timeout "${HOST_TIMEOUT:-150}" python3 -m nanograph bench host ${HOST_ARGS:---arms breakable} \
      --out "$out/host.json" > "$out/host.log" 2>&1
    grep "^==" "$out/host.log"
    timeout 150 python3 -m nanograph bench prefill --models qwen3-0.6b --lengths 256,1024,4096 \
      --arms full,breakable,tc_piecewise --peer-lengths '' --repeats 5 \
      --out "$out/prefill_check.json" 2>&1 | tee "$out/prefill_check.log" ;;
  bench-prefill)
    python3 -m nanograph bench prefill --models "${MODELS:-qwen3-0.6b,qwen3-8b}" \
      --repeats 5 --out "$out/prefill.json" 2>&1 | tee "$out/prefill.log" ;;
  bench-decode)
    python3 -m nanograph bench decode --models "${MODELS:-qwen3-0.6b,qwen3-8b}" \
      --arms "${ARMS:-eager,full,breakable}" --transformers \
      --out "$out/decode.json" 2>&1 | tee "$out/decode.log" ;;
  bench-misc)
    python3 -m nanograph bench build --out "$out/build.json" 2>&1 | tee "$out/build.log"
    python3 -m nanograph bench memory --out "$out/memory.json" 2>&1 | tee "$out/memory.log"
    python3 -m nanograph bench size --out "$out/size.json" 2>&1 | tee "$out/size.log" ;;
  report)
    python3 -m nanograph bench decode --models qwen3-8b --arms eager --batches 1,64 \
      --out "$out/report_decode.json" 2>&1 | tee "$out/report.log"
    python3 -m nanograph bench prefill --models qwen3-8b --arms eager --lengths 2048 \
      --peer-lengths '' --out "$out/report_prefill.json" 2>&1 | tee -a "$out/report.log"
    python3 -m nanograph bench floor --out "$out/floor.json" 2>&1 | tee "$out/floor.log"
    python3 -m nanograph bench floor --model qwen3-8b --lengths 512 --decode-batch 1 \
      --out "$out/floor_decode_8b.json" 2>&1 | tee -a "$out/floor.log" ;;
  remaining-decode)  # ~6 min: captures only the measured batch sizes (tc: ~12 s per shape)
    python3 -m nanograph bench decode --models "${MODELS:-qwen3-0.6b,qwen3-8b}" \
      --batches 1,8,32,128 --arms "${ARMS:-breakable,tc_piecewise}" --repeats 3 \
      --transformers --out "$out/decode_arms.json" 2>&1 | tee "$out/decode_arms.log" ;;
  remaining-build)  # ~6 min: prefill graph build on the default ladder (~40 shapes)
    python3 -m nanograph bench build --out "$out/build_default.json" 2>&1 \
      | tee "$out/build_default.log" ;;
  rerun)  # ~9 min: what cd44b17 left unmeasured (8b prefill arms after the break change;
    # decode full and eager after the scheduler fix and LaunchCache)
    timeout 300 python3 -m nanograph bench prefill --models qwen3-8b --lengths 256,512,1024,2048 \
      --peer-lengths 256 --repeats 5 --out "$out/prefill_8b.json" 2>&1 | tee "$out/prefill_8b.log"
    timeout 280 python3 -m nanograph bench decode --models qwen3-0.6b,qwen3-8b --arms full,eager \
      --batches 1,8,32,128 --repeats 3 --out "$out/decode.json" 2>&1 | tee "$out/decode.log" ;;
  sweep-32k)  # ~4 min: launch configurations of the 1 x 32k decode (the kernels issue's gap):
    # BLOCK_N x splits (8-128) x page-id prefetch x stages x warps, best first within 200 s
    python3 -m nanograph bench attention --cases decode_1x32k --sweep --sweep-seconds 200 \
      --out "$out/attention_32k.json" 2>&1 | tee "$out/attention_32k.log" ;;
  sweep-1x512)  # ~1 min: launch configurations of the batch-1 decode at 512 context (qwen3-8b
    # decode at batch 1 spends 0.31 ms of its 4.80 ms step there: 8.7 us a layer)
    python3 -m nanograph bench attention --cases decode_1x512 --sweep --sweep-seconds 60 \
      --out "$out/attention_1x512.json" 2>&1 | tee "$out/attention_1x512.log" ;;
  ncu-32k)  # ~2 min: hardware counters of the default 1 x 32k decode launch (why 55%, not 70%)
    ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    timeout 300 "$ncu_bin" --clock-control none -k regex:_paged_attention_kernel -s 1 -c 2 \
      --set full python3 -m nanograph bench attention --cases decode_1x32k --launch-only 3 \
      > "$out/ncu_32k.txt" 2>&1
    grep -iE "duration|dram throughput|memory throughput|achieved occupancy|registers|stall" \
      "$out/ncu_32k.txt" | head -40 ;;
  gemv)  # ~8 min: the batch-1 decode GEMV with PDL: every GPU test but the 130 s bf16
    # numerics one; decode at batch 1 with it against cuBLAS side by side; per product; the
    # kernel floor of a qwen3-8b step
    timeout 330 python3 -m pytest -q -p no:cacheprovider --durations=8 -rfE tests/gpu \
      --deselect tests/gpu/test_engine_gpu.py::test_bf16_greedy_agrees_with_float32_eager \
      > "$out/gpu_tests.log" 2>&1
    tail -12 "$out/gpu_tests.log"
    timeout 150 python3 -m nanograph bench decode --models qwen3-8b,qwen3-0.6b \
      --arms full,full:cublas --batches 1 --repeats 5 --out "$out/decode_gemv.json" 2>&1 \
      | grep -v "^INFO" | tee "$out/decode_gemv.log"
    timeout 60 python3 -m nanograph bench gemv --models qwen3-8b --out "$out/gemv.json" 2>&1 \
      | tee "$out/gemv.log"
    timeout 80 python3 -m nanograph bench floor --model qwen3-8b --lengths 512 --decode-batch 1 \
      --graph full --out "$out/floor_graph_8b_b1.json" > "$out/floor_graph_8b_b1.log" 2>&1
    tail -25 "$out/floor_graph_8b_b1.log" ;;
  sweep-small)  # ~2 min: decode attention launch configurations at small batches (1 x 512,
    # 8 x 1k: 8 takes 16 splits and the earlier tiles; is the 32-split choice better there too?)
    python3 -m nanograph bench attention --cases decode_1x512,decode_8x1k --sweep \
      --sweep-seconds 90 --out "$out/attention_small.json" 2>&1 | tee "$out/attention_small.log" ;;
  hardening)  # ~9 min: start-up and first requests with cold and warm kernel caches (bf16 and
    # fp32: nothing may compile on a request's path), then every GPU test but the 130 s bf16
    # numerics one, named as they pass (a timeout still leaves the log)
    timeout "${STARTUP_TIMEOUT:-250}" python3 -m nanograph bench startup --model qwen3-0.6b \
      --dtypes bfloat16,float32 --graphs "${GRAPHS:-auto,none}" --timeout "${ARM_TIMEOUT:-110}" --out "$out/startup.json" 2>&1 \
      | grep -v "^INFO" | tee "$out/startup.log"
    timeout "${TEST_TIMEOUT:-320}" python3 -m pytest -v -p no:cacheprovider -rfE --durations=10 \
      tests/gpu ${PYTEST_ARGS:-} \
      --deselect tests/gpu/test_engine_gpu.py::test_bf16_greedy_agrees_with_float32_eager \
      > "$out/gpu_tests.log" 2>&1
    grep -E "PASSED|FAILED|ERROR|passed|failed" "$out/gpu_tests.log" | grep -v PASSED | tail -25
    grep -c PASSED "$out/gpu_tests.log" ;;
  serve)  # ~9 min (estimated, not yet measured): `bench serve` on qwen3-0.6b then qwen3-8b
    # (dummy weights, ignore_eos). Arm default (decode full + prefill breakable): random
    # 1024-in/256-out at concurrency 1 and over request rates up to inf, the ShareGPT-like mix,
    # and --offline (LLM.generate on the saturation prompts, batch-1 decode step). Arms eager
    # and full/full: two rates each. Every arm caps the batch at 128 (fewer decode graphs to
    # capture) and first sends 128 untimed 8-token requests at once (kernels that compile on
    # first use do so there). Every arm captures at start-up (the engine's default on CUDA is
    # background capture): the graph arms are compared with their graphs in place, and the
    # --offline LLM takes the same flags. Each command is bounded by `timeout`; MODELS narrows
    # the run.
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
      --find-links "${SERVE_WHEELS:-.whl}" -r benchmarks/serve_wheels.txt 2>&1 | tail -2
    export PYTHONPATH=/tmp/site:$PYTHONPATH
    common="--load-format dummy --max-num-seqs 128 --cuda-graph-max-bs 128 --quiet \
      --cuda-graph-capture startup"
    for model in ${MODELS:-qwen3-0.6b qwen3-8b}; do
      if [ "$model" = qwen3-8b ]; then
        rates=inf,1,4,16,inf,4,inf prompts=6,8,24,64,128,24,128 budget=210 fast=4,inf
      else
        rates=inf,4,16,64,inf,16,inf prompts=6,16,64,128,128,64,128 budget=120 fast=16,inf
      fi
      timeout $budget python3 -m nanograph bench serve --launch "--model $model $common" --offline \
        --dataset random,random,random,random,random,sharegpt,sharegpt --request-rate $rates \
        --max-concurrency 1,0,0,0,0,0,0 --num-prompts $prompts --warmup 128 \
        --out "$out/serve_${model}_default.json" 2>&1 | tee "$out/serve_${model}_default.log"
      for arm in eager full; do
        graphs="--decode-cuda-graph none --prefill-cuda-graph none"
        [ $arm = full ] && graphs="--decode-cuda-graph full --prefill-cuda-graph full"
        timeout $((budget / 2)) python3 -m nanograph bench serve \
          --launch "--model $model $common $graphs" --request-rate $fast --num-prompts 48,128 \
          --warmup 128 \
          --out "$out/serve_${model}_$arm.json" 2>&1 | tee "$out/serve_${model}_$arm.log"
      done
    done ;;
  serve-gil)  # ~5 min (estimated): issue 13's GIL question on qwen3-0.6b. The server's engine
    # thread shares the GIL with the HTTP handlers (0.78x of offline throughput at saturation,
    # 349d9fe). Saturation (rate inf, 128 prompts) with the default 5 ms switch interval, then
    # with 0.2 ms in the server process only (a sitecustomize.py: at start-up `python3 -m
    # nanograph serve` has argv ['-m', 'serve', ...], the bench client ['-m', 'bench', ...])
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
      --find-links "${SERVE_WHEELS:-.whl}" -r benchmarks/serve_wheels.txt 2>&1 | tail -2
    mkdir -p /tmp/gil && printf '%s\n' 'import sys' \
      'if sys.argv[1:2] == ["serve"]: sys.setswitchinterval(float(__import__("os").environ.get("GIL_SWITCH_S", "0.005")))' \
      > /tmp/gil/sitecustomize.py
    export PYTHONPATH=/tmp/gil:/tmp/site:$PYTHONPATH
    # start-up capture, as in the serve stage it is compared with
    common="--model qwen3-0.6b --load-format dummy --max-num-seqs 128 --cuda-graph-max-bs 128 \
      --quiet --cuda-graph-capture startup"
    for switch in 0.005 0.0002; do
      GIL_SWITCH_S=$switch timeout 130 python3 -m nanograph bench serve --launch "$common" --offline \
        --dataset random,random --request-rate inf,inf --num-prompts 128,128 --warmup 128 \
        --out "$out/serve_gil_$switch.json" 2>&1 | grep -v "^INFO" | tail -12
    done ;;
  serve-process)  # ~4 min: issue 13's other arm on qwen3-0.6b, beside serve-gil. Saturation
    # (rate inf, 128 prompts) with the engine in its own process (the default since 37fae24's
    # measurement: 0.885x of offline) and in a thread of the server (--no-engine-process: 0.74x)
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
      --find-links "${SERVE_WHEELS:-.whl}" -r benchmarks/serve_wheels.txt 2>&1 | tail -2
    export PYTHONPATH=/tmp/site:$PYTHONPATH
    common="--model qwen3-0.6b --load-format dummy --max-num-seqs 128 --cuda-graph-max-bs 128 --quiet"
    for arm in thread process; do
      flags="$common --engine-process"; [ $arm = thread ] && flags="$common --no-engine-process"
      timeout 130 python3 -m nanograph bench serve --launch "$flags" --offline \
        --dataset random,random --request-rate inf,inf --num-prompts 128,128 --warmup 128 \
        --out "$out/serve_process_$arm.json" 2>&1 | grep -v "^INFO" | tail -12
    done ;;
  prefix)  # ~6 min (at most 10): prefix caching on vs off (issue 14). The test: 3 prefill
    # backends on a small model (tc_piecewise compiles 19 shapes); the bench: two qwen3-8b
    # engines (caching off, on), 64 chats x 6 turns, 32 few-shot, 2 x 32 unrelated prompts
    timeout 240 python3 -m pytest -q -s -p no:cacheprovider --durations=5 -rfE \
      tests/gpu/test_prefix_gpu.py > "$out/prefix_tests.log" 2>&1
    grep -E "prefill=|passed|failed|error" "$out/prefix_tests.log" | tail -8
    timeout 360 python3 -m nanograph bench prefix --fewshot-requests 32 --nosharing-requests 32 \
      --repeats 2 --out "$out/prefix.json" 2>&1 | grep -v "^INFO" | tee "$out/prefix.log" ;;
  moe)  # <= ~8 min: MoE models (issue 15). GPU tests (transformers, graph backends vs eager,
    # the fused MoE vs the native loop per layer); decode at batch 1 on qwen3-30b-a3b (dummy,
    # 61 GB bf16) with the fused MoE against its roofline (aim >= 60%); prefill at 256 tokens
    # with the native MoE, breakable vs eager (aim >= 1.5x)
    timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -q -s -p no:cacheprovider --durations=10 \
      -rfE tests/gpu/test_moe_gpu.py ${PYTEST_ARGS:-} > "$out/moe_tests.log" 2>&1
    grep -E "rel err|identical|passed|failed|Error" "$out/moe_tests.log" | tail -60
    timeout 75 python3 -m nanograph bench decode --models qwen3-30b-a3b --arms full \
      --batches 1 --repeats 3 --moe-backend triton --out "$out/decode_moe.json" 2>&1 \
      | grep -v "^INFO" | tee "$out/decode_moe.log"
    timeout 90 python3 -m nanograph bench prefill --models qwen3-30b-a3b,gpt-oss-20b \
      --lengths 256 --arms eager,breakable --moe-backend torch_native --peer-lengths '' \
      --repeats 5 --out "$out/prefill_moe.json" 2>&1 | grep -v "^INFO" | tee "$out/prefill_moe.log" ;;
  moe-decode)  # ~5 min: issue 15's batch-1 MoE decode: the fused MoE's per-layer GPU tests, the
    # kernel floor of a qwen3-30b-a3b decode step (where its time goes, kernel by kernel), then
    # its tokens/s against the roofline
    timeout 80 python3 -m pytest -q -p no:cacheprovider -rfE tests/gpu/test_moe_gpu.py \
      -k "fused_moe_matches_native_per_layer or fused_decode_of_a_moe_layer" \
      > "$out/moe_layer_tests.log" 2>&1
    tail -2 "$out/moe_layer_tests.log"
    timeout 100 python3 -m nanograph bench floor --model qwen3-30b-a3b --decode-batch 1 \
      --lengths 512 --graph full --out "$out/floor_moe.json" 2>&1 | grep -v "^INFO" \
      | tee "$out/floor_moe.log"
    timeout 150 python3 -m nanograph bench decode --models qwen3-30b-a3b,gpt-oss-20b --arms full \
      --batches 1 --repeats 3 --moe-backend triton --out "$out/decode_moe.json" 2>&1 \
      | grep -v "^INFO" | tee "$out/decode_moe.log" ;;
  moe-sweep)  # ~4 min: issue 15's MoE decode products on qwen3-30b-a3b, one at a time: q/k/v,
    # o, router and lm_head GEMVs against cuBLAS with every GEMV tile, and the fused experts of
    # one token with every down-projection tile (`bench gemv --sweep`)
    timeout 330 python3 -m nanograph bench gemv --models qwen3-30b-a3b --sweep --rep-ms 60 \
      --out "$out/gemv_moe.json" 2>&1 | grep -v "^INFO" | tee "$out/gemv_moe.log" ;;
  moe-coverage)  # <= ~8 min: which graph backend holds which model (qwen3-8b dense,
    # qwen3-30b-a3b, gpt-oss-20b; MoE triton and torch_native); JSON written after every cell.
    # If it runs out of time, run the rest separately: MODELS=gpt-oss-20b SUFFIX=_oss
    timeout 470 python3 -m nanograph bench coverage \
      --models "${MODELS:-qwen3-8b,qwen3-30b-a3b,gpt-oss-20b}" \
      --out "$out/coverage${SUFFIX:-}.json" 2>&1 | grep -v "^INFO" | tee "$out/coverage${SUFFIX:-}.log" ;;
  fair-peer)  # ~8 min: prefill eager and full against the fair peer (compiled transformers,
    # sdpa, last-token logits) at 256 / 2k / 8k; the decode roofline of this device, measured
    timeout 400 python3 -m nanograph bench prefill --models qwen3-0.6b --lengths 256,2048,8192 \
      --arms eager,full --peer-lengths 256,2048,8192 --repeats 5 --out "$out/prefill_fair.json" \
      2>&1 | grep -v "^INFO" | tee "$out/prefill_fair.log"
    timeout 120 python3 -m nanograph bench decode --models qwen3-0.6b --arms eager,full \
      --batches 1 --repeats 3 --out "$out/decode_roofline.json" 2>&1 | grep -v "^INFO" \
      | tee "$out/decode_roofline.log" ;;
  spec)  # <= ~8 min (estimated, not yet measured): speculative decoding (issue 16). GPU tests
    # (verify/draft backend combinations, padded verify rows, pools); then bench spec on
    # qwen3-8b (dummy weights): off, ngram k=2/4/8, draft qwen3-0.6b k=4, self-draft k=4 at
    # batch 1/4/16/64. The JSON is written after every arm; ARMS / BATCHES narrow the run.
    timeout "${TEST_TIMEOUT:-220}" python3 -m pytest -q -s -p no:cacheprovider --durations=8 \
      -rfE tests/gpu/test_spec_gpu.py ${PYTEST_ARGS:-} > "$out/spec_tests.log" 2>&1
    grep -E "agreement|passed|failed|Error" "$out/spec_tests.log" | tail -30
    timeout "${BENCH_TIMEOUT:-250}" python3 -m nanograph bench spec --target qwen3-8b \
      --drafter qwen3-0.6b --arms "${ARMS:-off,ngram:2,ngram:4,ngram:8,draft:4,self:4}" \
      --batches "${BATCHES:-1,4,16,64}" --new-tokens 128 --repeats 2 --out "$out/spec.json" \
      2>&1 | grep -v "^INFO" | tee "$out/spec.log" ;;
  tp)  # <= ~8 min on 2 x H200 (issue 19): TP=2 equals TP=1 eager under full / breakable /
    # tc_piecewise with NCCL inside the graphs, 1,000 replays without memory growth; then
    # qwen3-8b (dummy) decode at batch 1 and 32 (aim: TP=2 >= 1.6x TP=1 at batch 1) and
    # prefill at 2048 / 8192 tokens (aim: >= 1.7x at 8192), TP=1 and TP=2 in one run each
    # NVLink multicast stays off (the device's rule; the spawned ranks inherit this environment)
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    python3 -c 'import torch; print("GPUs:", torch.cuda.device_count(), "NCCL", torch.cuda.nccl.version())'
    nvidia-smi topo -m | tee "$out/tp_topology.txt"
    timeout 150 python3 -m pytest -q -s -p no:cacheprovider --durations=10 -rfE \
      tests/gpu/test_tensor_parallel_gpu.py > "$out/tp_tests.log" 2>&1
    grep -E "TP=2|replays|passed|failed|Error" "$out/tp_tests.log" | tail -30
    timeout 150 python3 -m nanograph bench decode --models qwen3-8b --arms full,full:tp2 \
      --batches 1,32 --repeats 3 --out "$out/decode_tp.json" 2>&1 | grep -v "^INFO" \
      | tee "$out/decode_tp.log"
    timeout 170 python3 -m nanograph bench prefill --models qwen3-8b --lengths 2048,8192 \
      --arms full,full:tp2 --peer-lengths '' --repeats 5 --out "$out/prefill_tp.json" 2>&1 \
      | grep -v "^INFO" | tee "$out/prefill_tp.log" ;;
  capture)  # <= ~8 min (estimated, not yet measured): serve while capturing (issue 17). GPU
    # tests of background/lazy capture (tokens vs eager and startup, memory over 1000 steps,
    # eviction); then `bench startup --capture-modes` on qwen3-0.6b and qwen3-8b (dummy):
    # ready time, first TTFT, tokens/s curve and graph memory per mode under 16 requests in
    # flight (batch <= 16: the learned ladder's memory aim). Each command is bounded.
    # Each bench first fills the kernel caches with an untimed start-up (~50 s cold on 0.6b).
    timeout "${TEST_TIMEOUT:-100}" python3 -m pytest -q -s -p no:cacheprovider --durations=8 -rfE \
      tests/gpu/test_live_capture_gpu.py ${PYTEST_ARGS:-} > "$out/capture_tests.log" 2>&1
    grep -E "capture|allocated|passed|failed|Error" "$out/capture_tests.log" | tail -30
    common="--load-format dummy --dtypes bfloat16 --concurrency 16 --short 64 --long 512 \
      --new-tokens 128"
    timeout 170 python3 -m nanograph bench startup --model qwen3-0.6b $common --duration 10 \
      --capture-modes eager,startup,background,background:default,lazy --timeout 90 \
      --out "$out/capture_06b.json" 2>&1 | grep -v "^INFO" | tee "$out/capture_06b.log"
    timeout 230 python3 -m nanograph bench startup --model qwen3-8b $common --duration 12 \
      --capture-modes eager,startup,background,background:default --timeout 120 \
      --out "$out/capture_8b.json" 2>&1 | grep -v "^INFO" | tee "$out/capture_8b.log" ;;
  fusion)  # <= ~8.2 min (estimated, not yet measured; each command bounded): issue 18's
    # batch-1 decode fusions (norm in the q/k/v and gate/up GEMVs, SiLU in gate/up's, residual
    # add in the o and down GEMVs, no zero fill before attention, rope+store as a PDL
    # dependent; the last one is in both arms). GPU tests of the fused GEMV variants at model shapes, fused vs unfused greedy
    # decode and the kernel count; the decode GEMV's and fused kernels' tests; no compile on a
    # request path (the new variants compile at start-up). Then bench decode full vs
    # full:unfused at batch 1-128 with kernels per step (the profiler) on each model; JSON is
    # written after every arm, so a timeout keeps what finished.
    timeout 180 python3 -m pytest -q -s -p no:cacheprovider --durations=8 -rfE \
      tests/gpu/test_fused_decode_gpu.py tests/gpu/test_gemv_gpu.py \
      tests/gpu/test_kernels_fused.py \
      tests/gpu/test_hardening_gpu.py::test_no_kernel_compiles_on_a_request_path \
      > "$out/fusion_tests.log" 2>&1
    grep -E "agreement|kernels a decode|passed|failed|Error" "$out/fusion_tests.log" | tail -20
    timeout 130 python3 -m nanograph bench decode --models qwen3-0.6b --arms full,full:unfused \
      --batches 1,8,32,128 --repeats 3 --out "$out/decode_fusion_06b.json" 2>&1 \
      | grep -v "^INFO" | tee "$out/decode_fusion_06b.log"
    timeout 180 python3 -m nanograph bench decode --models qwen3-8b --arms full,full:unfused \
      --batches 1,8,32,128 --repeats 3 --out "$out/decode_fusion_8b.json" 2>&1 \
      | grep -v "^INFO" | tee "$out/decode_fusion_8b.log" ;;
  serve-saturation)  # ~3 min: issue 13's saturation aim on qwen3-0.6b, 128 and 512 prompts at
    # once, each against LLM.generate on the same prompts, with every process's CPU% (top, 1 s)
    # beside it: at 7921a50 the load generator itself ran at ~100% of a core (httpx then)
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
      --find-links "${SERVE_WHEELS:-.whl}" -r benchmarks/serve_wheels.txt 2>&1 | tail -2
    export PYTHONPATH=/tmp/site:$PYTHONPATH
    top -b -d 1 -n 240 -c -w 200 > "$out/serve_saturation_top.log" 2>&1 &
    top_pid=$!
    timeout 220 python3 -m nanograph bench serve --launch "--model qwen3-0.6b --load-format dummy \
      --max-num-seqs 128 --cuda-graph-max-bs 128 --quiet --cuda-graph-capture startup" --offline \
      --dataset random,random --request-rate inf,inf --num-prompts 128,512 --warmup 128 \
      --out "$out/serve_saturation.json" 2>&1 | grep -v "^INFO" | tee "$out/serve_saturation.log"
    kill $top_pid ;;
  ab-floor)  # ~20 s a run: this tree against another commit's kernels, side by side in one
    # call (machines differ by 1-2% between calls, as much as the gains left). BASE: a folder
    # holding that commit's nanograph/ (`mkdir ab && git archive COMMIT nanograph | tar x -C ab`;
    # untracked, so it travels); this tree's bench/floor.py is copied into it for replay_ms.
    # The decode graph's replay time (`bench floor`'s replay_ms) per MODELS x BATCHES, the two
    # trees alternating twice
    base=$(cd "${BASE:?set BASE to a folder holding the base commit nanograph/}" && pwd)
    cp nanograph/bench/floor.py "$base/nanograph/bench/floor.py"
    dest=$(cd "$out" && pwd)
    for m in ${MODELS:-qwen3-0.6b}; do for b in ${BATCHES:-1 8}; do for i in 1 2; do
      for t in new base; do
        d=$PWD; [ $t = base ] && d=$base; name="ab_${m}_b${b}_${t}_$i"
        (cd "$d" && PYTHONPATH=$d timeout 120 python3 -m nanograph bench floor --model "$m" \
          --decode-batch "$b" --lengths 512 --graph full --repeats 20 --out "$dest/$name.json" \
          2>&1 | grep -v "^INFO" > "$dest/$name.log")
        echo "$m batch $b $t $i: $(grep -o 'graph replays alone [0-9.]* ms' "$dest/$name.log")"
      done
    done; done; done ;;
  prefill-long)  # ~6 min: issue 18's long prompts. Extend attention against every SDPA
    # backend at 1 x 8k / 32k in both head layouts (tiles swept at 8k), where a qwen3-0.6b
    # prefill of 8k tokens spends its GPU time, and that prefill against the fair peer
    timeout 240 python3 -m nanograph bench attention --cases \
      extend_1x8192,extend_1x8192_06b,extend_1x32k,extend_1x32k_06b,extend_32x256 \
      --out "$out/attention_extend.json" 2>&1 | tee "$out/attention_extend.log"
    timeout 200 python3 -m nanograph bench attention --cases extend_1x8192_06b,extend_1x8192 \
      --sweep --sweep-seconds "${SWEEP_SECONDS:-120}" --rep-ms 60 \
      --out "$out/attention_extend_sweep.json" > "$out/attention_extend_sweep.log" 2>&1
    grep "sweep\|wrote" "$out/attention_extend_sweep.log"
    timeout 120 python3 -m nanograph bench floor --model qwen3-0.6b --lengths 8192 --graph full \
      --out "$out/floor_prefill_8k.json" 2>&1 | grep -v "^INFO" | tee "$out/floor_prefill_8k.log"
    timeout 240 python3 -m nanograph bench prefill --models qwen3-0.6b --lengths 2048,8192 \
      --arms eager,full --peer-lengths 8192 --repeats 5 --out "$out/prefill_long.json" \
      2>&1 | grep -v "^INFO" | tee "$out/prefill_long.log" ;;
  prefill-verify)  # <= ~9 min (estimated): stop 29's attention (long-prompt tiles,
    # launch_plan) as committed: its GPU tests in two processes, then issue 18's qwen3-0.6b
    # prefill table, every arm beside the fair peer. MODELS=qwen3-8b for the 8b table (then
    # TESTS=0 skips the tests)
    if [ "${TESTS:-1}" = 1 ]; then
      timeout 240 python3 -m pytest -q -p no:cacheprovider -rfE tests/gpu/test_kernels_attention.py \
        tests/gpu/test_runners_gpu.py > "$out/gpu_tests_attention.log" 2>&1 &
      timeout 240 python3 -m pytest -q -p no:cacheprovider -rfE tests/gpu/test_prefix_gpu.py \
        tests/gpu/test_hardening_gpu.py -k "cached_prefixes or no_kernel_compiles" \
        > "$out/gpu_tests_prefix_nocompile.log" 2>&1 &
      wait
      for f in "$out"/gpu_tests_attention.log "$out"/gpu_tests_prefix_nocompile.log; do tail -n 1 "$f"; done
    fi
    m=${MODELS:-qwen3-0.6b}
    timeout 330 python3 -m nanograph bench prefill --models "$m" --lengths 256,1024,2048,4096,8192 \
      --peer-lengths 256,2048,8192 --repeats 5 --out "$out/prefill_$m.json" 2>&1 \
      | grep -v "^INFO\|Warning\|warn" | tee "$out/prefill_$m.log" ;;
  decode-verify)  # <= ~9 min (estimated): stop 31's one-row decode launches (attention as a
    # PDL dependent, rope + KV store inside it): the no-compile test its warm-up fix is for and
    # the fused decode tests, then issue 18's and 15's batch-1 tokens/s with kernels per step
    timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE tests/gpu/test_hardening_gpu.py \
      -k no_kernel_compiles > "$out/gpu_tests_nocompile.log" 2>&1 &
    timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE tests/gpu/test_fused_decode_gpu.py \
      tests/gpu/test_moe_gpu.py -k "fused" > "$out/gpu_tests_fused.log" 2>&1 &
    wait
    for f in "$out"/gpu_tests_nocompile.log "$out"/gpu_tests_fused.log; do tail -n 1 "$f"; done
    timeout 200 python3 -m nanograph bench decode --models qwen3-0.6b,qwen3-8b \
      --arms full,full:unfused --batches 1,8,32 --repeats 3 --out "$out/decode_fused.json" 2>&1 \
      | grep -v "^INFO" | tee "$out/decode_fused.log"
    timeout 100 python3 -m nanograph bench decode --models qwen3-30b-a3b --arms full --batches 1 \
      --repeats 3 --moe-backend triton --out "$out/decode_moe.json" 2>&1 | grep -v "^INFO" \
      | tee "$out/decode_moe.log" ;;
  ab-attention)  # ~40 s a run: `bench attention` of this tree against BASE's (a folder holding
    # another commit's nanograph/, as for ab-floor), the two alternating twice, over CASES
    base=$(cd "${BASE:?set BASE to a folder holding the base commit nanograph/}" && pwd)
    dest=$(cd "$out" && pwd)
    for i in 1 2; do for t in new base; do
      d=$PWD; [ $t = base ] && d=$base; name="ab_attention_${t}_$i"
      (cd "$d" && PYTHONPATH=$d timeout 150 python3 -m nanograph bench attention \
        --cases "${CASES:-extend_1x8192,extend_1x8192_06b,extend_32x256,decode_1x512}" \
        --out "$dest/$name.json" 2>&1 | grep -v "Warning\|return F" > "$dest/$name.log")
      echo "== $t $i"; grep "triton" "$dest/$name.log" | cut -c1-60
    done; done ;;
  tests-parallel)  # ~6 min: tests/gpu but tensor parallelism, as five pytest processes at once
    # (cold Triton compiles are single-threaded per process; no test asserts a time). Each
    # group is bounded by TEST_TIMEOUT and logs to its own file; the summary lines follow.
    groups=("test_engine_gpu.py test_front_gpu.py"
      "test_moe_gpu.py test_spec_gpu.py"
      "test_graph_backends.py test_graph_memory.py test_runners_gpu.py"
      "test_sampling_gpu.py test_live_capture_gpu.py test_prefix_gpu.py test_hardening_gpu.py"
      "test_kernels_attention.py test_kernels_fused.py test_fused_decode_gpu.py test_gemv_gpu.py")
    for i in "${!groups[@]}"; do
      files=$(printf 'tests/gpu/%s ' ${groups[$i]})
      timeout "${TEST_TIMEOUT:-330}" python3 -m pytest -q -p no:cacheprovider --durations=5 -rfE \
        $files > "$out/gpu_tests_$i.log" 2>&1 &
    done
    wait
    for i in "${!groups[@]}"; do echo "== ${groups[$i]}"; grep -E "^(FAILED|ERROR)|passed|failed" \
      "$out/gpu_tests_$i.log" | tail -8; done ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
