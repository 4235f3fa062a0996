"""The Hopper extend attention with a 3-slot K/V ring instead of 2 (stop 71; on the device
from the repo root: ``python3 docs/wip/hopper_stages_probe.py``).

Why: issue 18's attention aim (at least the best SDPA backend's TFLOP/s at 1 x 8192 and
1 x 32k, qwen3-8b and qwen3-0.6b heads) is met except 1 x 32k with 0.6b heads, level with
cuDNN (0.95-1.01x over five runs, stop 53). ``kernels/attention_hopper.py`` keeps K and V in
2-slot rings (160 KiB of shared memory with Q); 3 slots fit (224 KiB, compiled for sm_90 on
the CPU machine) and leave the producer one more block ahead of the softmax.
For each case: both depths' outputs compared (the same operations in the same order), then
the Hopper launch timed in a graph (``graphed_samples``), 2 and 3 slots alternating three
times.

PREDICTED: 3 slots 0-3% faster at 1 x 32k (the loads are hidden already in the steady state;
what more depth buys is the first blocks and the waits behind a slow TMA).
MEASURED (stop 71, H100, ``benchmarks/results/h100/stop71_b49c8ae/``): outputs identical;
3 / 2 slots 1.024 (1 x 32k, 8b heads), 0.964 (1 x 32k, 0.6b heads), 1.034 (1 x 8192, 0.6b
heads), each run of one depth spreading 5-19%: no gain beyond the noise; not landed.
"""

import torch

CASES = ("extend_1x32k", "extend_1x32k_06b", "extend_1x8192_06b")


def main() -> None:
    from nanograph.bench.attention import CASES as ALL
    from nanograph.bench.attention import _paged_batch, _triton_fn
    from nanograph.bench.common import graphed_samples, median
    from nanograph.kernels import attention_hopper

    print(torch.cuda.get_device_name(), flush=True)
    for name in CASES:
        case = next(c for c in ALL if c.name == name)
        batch = _paged_batch(case)
        run = _triton_fn(case, batch, hopper=True)
        outs = []
        for stages in (2, 3):
            attention_hopper.STAGES = stages
            outs.append(run().clone())
        diff = (outs[0].float() - outs[1].float()).abs().max().item()
        times = {2: [], 3: []}
        for _ in range(3):
            for stages in (2, 3):
                attention_hopper.STAGES = stages
                times[stages].append(median(graphed_samples(run, 200)))
        ratio = median(times[3]) / median(times[2])
        print(f"{name}: 2 slots {[round(t, 4) for t in times[2]]} ms, 3 slots "
              f"{[round(t, 4) for t in times[3]]} ms, 3/2 {ratio:.3f}; "
              f"outputs differ by {diff}", flush=True)  # fmt: skip
    attention_hopper.STAGES = 2


if __name__ == "__main__":
    main()
