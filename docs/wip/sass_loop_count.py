"""Instructions in one loop of a SASS file written by ``tests/sm90_compile.py --sass``.

    python3 docs/wip/sass_loop_count.py FILE.sass LINE [SKIP_LINE]

LINE is the (1-based) line of the loop's backward ``BRA``; the body is every instruction from
its target to it (addresses are gone from these files, but instructions are 16 bytes, so the
target's address is an index). SKIP_LINE, a forward branch inside the loop, also prints the
instructions it jumps over and the common path without them (stop 46: the long-prompt TMA key
loop, 368 instructions with Triton 3.6; 288 on the lazy rescale's common path).
"""

from __future__ import annotations

import collections
import re
import sys


def instructions(lines: list[str]) -> list[int]:
    """Indices of the lines that hold an instruction (not an encoding-only line)."""
    return [i for i, line in enumerate(lines) if ";" in line and not line.startswith("/*")]


def branch_target(line: str) -> int:
    return int(re.search(r"BRA (0x[0-9a-f]+)", line).group(1), 16) // 16


def opcode(line: str) -> str:
    words = line.split()
    return (words[1] if words[0].startswith("@") else words[0]).split(".")[0]


def main(path: str, loop_line: int, skip_line: int | None = None) -> None:
    lines = open(path).read().splitlines()
    ins = instructions(lines)
    end = ins.index(loop_line - 1)
    body = [lines[i] for i in ins[branch_target(lines[loop_line - 1]) : end + 1]]
    counts = collections.Counter(map(opcode, body))
    print(f"{len(body)} instructions;", dict(counts.most_common(14)))
    if skip_line is not None:
        at = ins.index(skip_line - 1)
        skipped = branch_target(lines[skip_line - 1]) - at - 1
        print(f"skipped by the branch: {skipped} -> common path {len(body) - skipped}")


if __name__ == "__main__":
    main(sys.argv[1], *map(int, sys.argv[2:]))
