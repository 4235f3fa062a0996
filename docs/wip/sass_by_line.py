"""Where a kernel's instructions come from, by source line (stop 58; CPU, no GPU needed).

Compiles the one-row decode attention for sm_90 through ``tests/sm90_compile.py``'s stand-in
launcher (qwen3-0.6b's heads by default: ``--q-heads 32`` for qwen3-8b's), disassembles it with
Triton's bundled ``nvdisasm -gi`` (line info), and counts instructions per function and per
source line. With ``--ncu SASS_CSV`` (``ncu -i REP --page source --print-source sass --csv`` of
the same kernel, as ``stop57_calls.sh ncu`` writes it) only the instructions that ran
``--runs`` times are counted (a working warp's straight-line path: 512 = 64 programs x 8 warps
at 511 tokens; the merging slice's code ran 64 times). Stop 58 found the one-row decode's key
loops and merge this way (``onerow_lean.patch``).

    PYTHONPATH=/tmp/t36:$PWD python3 docs/wip/sass_by_line.py [--q-heads N] [--ncu CSV]

(a Triton 3.6 install at /tmp/t36, as for tests/sm90_compile.py; apply a patch first to see
its variant.)
"""

import argparse
import collections
import csv
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import triton

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
import sm90_compile  # noqa: E402

from nanograph.kernels import attention, attention_tiles, pdl  # noqa: E402
from nanograph.kernels.testing import make_paged_batch  # noqa: E402

NVDISASM = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
KERNEL_FILE = ROOT / "nanograph" / "kernels" / "attention_kernel.py"


def one_row_cubin(q_heads: int, out_dir: str) -> str:
    """The one-row decode's variant as choose_tiles picks it on an H100 or H200 for batch 1
    (132 SMs; CPU tensors compile what a GPU would launch)."""
    cubins: list[str] = []

    def keep(cubin: bytes, name: str) -> None:
        path = os.path.join(out_dir, f"{len(cubins):02d}_{name}.cubin")
        Path(path).write_bytes(cubin)
        cubins.append(path)

    sm90_compile._write_sass, sm90_compile.SASS_DIR = keep, out_dir
    attention._launch_attention.kernel = sm90_compile.CompileOnly(
        attention._launch_attention.kernel
    )
    pdl.enabled = lambda t: True
    attention_tiles._sm_count = lambda index: 132
    tiles = attention_tiles.choose_tiles(torch.device("cuda", 0), 1, 1, q_heads, 8, 128, 1)
    batch = make_paged_batch([40], [1], num_q_heads=q_heads, num_kv_heads=8, head_dim=128,
                             page_size=16, dtype=torch.bfloat16)  # fmt: skip
    k, v = torch.randn(2, 1, 8, 128, dtype=torch.bfloat16)
    weight = torch.ones(128, dtype=torch.bfloat16)
    rope = attention.RopeStore(k, v, batch.positions, torch.randn(256, 128), batch.slot_mapping,
                               weight, weight)  # fmt: skip
    attention.paged_attention(batch.q, batch.k_cache, batch.v_cache, *batch.metadata(),
                              batch.page_size, 0.1, max_query_len=1, tiles=tiles,
                              rope=rope)  # fmt: skip
    return cubins[-1]


def instructions(cubin: str) -> list[tuple[tuple[str, int] | None, str]]:
    """(source file name and line, instruction) for each SASS instruction, in address order."""
    text = subprocess.run([NVDISASM, "-gi", "-c", cubin], capture_output=True, text=True,
                          check=True).stdout  # fmt: skip
    out, loc = [], None
    for line in text.splitlines():
        if m := re.search(r'//## File "([^"]+)", line (\d+)', line):
            loc = (Path(m.group(1)).name, int(m.group(2)))
        elif m := re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?);", line):
            out.append((loc, m.group(1).strip()))
    return out


def ncu_counts(path: str) -> list[int]:
    """Per instruction, how many times a warp executed it: the first kernel of the export."""
    rows = list(csv.reader(open(path)))
    starts = [i for i, r in enumerate(rows) if r and r[0] == "Kernel Name"]
    end = starts[1] if len(starts) > 1 else len(rows)
    header, data = rows[starts[0] + 1], rows[starts[0] + 2 : end]
    col = header.index("Instructions Executed")
    return [int(r[col] or 0) for r in data]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--q-heads", type=int, default=16)
    parser.add_argument("--ncu", help="ncu's source page (sass, csv) of the same kernel")
    parser.add_argument("--runs", type=int, default=512, help="with --ncu: count these only")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ins = instructions(one_row_cubin(args.q_heads, tmp))
    keep = [True] * len(ins)
    if args.ncu:
        counts = ncu_counts(args.ncu)
        if len(counts) != len(ins):
            sys.exit(f"ncu lists {len(counts)} instructions, this build {len(ins)}: not the same "
                     "kernel (another tree, shape or Triton)")  # fmt: skip
        keep = [c == args.runs for c in counts]
    source = KERNEL_FILE.read_text().splitlines()
    defs = [(i + 1, m.group(1)) for i, line in enumerate(source)
            if (m := re.match(r"def (\w+)", line))]  # fmt: skip

    def function(loc: tuple[str, int] | None) -> str:
        if loc is None or loc[0] != KERNEL_FILE.name:
            return loc[0] if loc else "?"
        return max(((n, f) for n, f in defs if n <= loc[1]), default=(0, "?"))[1]

    by_function, by_line = collections.Counter(), collections.Counter()
    for (loc, _), counted in zip(ins, keep):
        if counted:
            by_function[function(loc)] += 1
            by_line[loc] += 1
    label = f"run {args.runs} times (ncu)" if args.ncu else "in the kernel"
    print(f"{sum(by_function.values())} of {len(ins)} instructions {label}, by function:")
    for name, n in by_function.most_common():
        print(f"  {n:5d} {name}")
    print("by source line:")
    for loc, n in by_line.most_common(args.top):
        text = source[loc[1] - 1].strip()[:72] if loc and loc[0] == KERNEL_FILE.name else ""
        print(f"  {n:5d} {loc[0] if loc else '?'}:{loc[1] if loc else 0} {text}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
