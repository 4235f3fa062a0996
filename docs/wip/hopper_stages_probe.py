"""The Hopper extend attention with a 3-slot K/V ring instead of 2 (stop 71; on the device
from the repo root: ``python3 docs/wip/hopper_stages_probe.py $OUT/h``).

Why: issue 18's attention aim (at least the best SDPA backend's TFLOP/s at 1 x 8192 and
1 x 32k, qwen3-8b and qwen3-0.6b heads) is met except 1 x 32k with 0.6b heads, level with
cuDNN (0.95-1.01x over five runs, stop 53). ``kernels/attention_hopper.py`` keeps K and V in
2-slot rings (160 KiB of shared memory with Q); 3 slots fit (224 KiB, compiled for sm_90 on
the CPU machine) and leave the producer one more block ahead of the softmax.
Checks first that both depths give the same output (the same operations in the same order),
then runs ``bench attention`` on the 1 x 32k cases alternating 2 and 3 slots twice.

PREDICTED: 3 slots 0-3% faster at 1 x 32k (the loads are hidden already in the steady state;
what more depth buys is the first blocks and the waits behind a slow TMA).
"""

import subprocess
import sys

import torch

CASES = "extend_1x32k,extend_1x32k_06b"


def same_output() -> None:
    from nanograph.bench.attention import CASES as ALL
    from nanograph.bench.attention import _paged_batch, _triton_fn
    from nanograph.kernels import attention_hopper

    case = next(c for c in ALL if c.name == "extend_1x8192_06b")
    batch = _paged_batch(case)
    outs = []
    for stages in (2, 3):
        attention_hopper.STAGES = stages
        run = _triton_fn(case, batch, hopper=True)
        outs.append(run().clone())
    torch.cuda.synchronize()
    diff = (outs[0].float() - outs[1].float()).abs().max().item()
    print(f"1 x 8192, 0.6b heads: 2 against 3 slots, max difference {diff}", flush=True)


def main() -> None:
    out = sys.argv[1]
    same_output()
    for round_ in range(2):
        for stages in (2, 3):
            code = (
                "import sys; from nanograph.kernels import attention_hopper as h; "
                f"h.STAGES = {stages}; from nanograph.bench.attention import main; "
                f"sys.exit(main(['--cases', '{CASES}', '--out', '{out}/s{stages}_r{round_}.json']))"
            )
            result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
            lines = [x for x in result.stdout.splitlines() if "hopper" in x]
            print(f"round {round_} stages {stages}:", *lines, sep="\n  ", flush=True)


if __name__ == "__main__":
    main()
