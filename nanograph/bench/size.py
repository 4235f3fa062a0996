"""``nanograph bench size``: lines of each graph backend's implementation.

A backend's size is its own module plus the shared graph-layer modules it imports (capture,
breaks, memory, structure, base), counted as code lines (no blanks, no comment-only lines) and
as physical lines. No device needed.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

from nanograph.bench.common import default_out, environment, write

GRAPH_DIR = Path(__file__).resolve().parent.parent / "graph"
BACKEND_MODULES = {"eager": "eager", "full": "full", "breakable": "breakable",
                   "tc_piecewise": "piecewise"}  # fmt: skip


def count(path: Path) -> dict[str, int]:
    lines = path.read_text().splitlines()
    code = [ln for ln in lines if ln.strip() and not ln.strip().startswith("#")]
    return {"lines": len(lines), "code": len(code)}


def graph_imports(path: Path) -> set[str]:
    """Modules of nanograph.graph that ``path`` imports at module level (the lazy imports in
    ``get_backend`` pick a backend; they are not part of each backend)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nanograph.graph."):
            names.add(node.module.rsplit(".", 1)[1])
    return names


def closure(module: str) -> set[str]:
    seen, todo = set(), [module]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += graph_imports(GRAPH_DIR / f"{name}.py")
    return seen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nanograph bench size", description=__doc__)
    parser.add_argument("--out", default=default_out("size.json"))
    args = parser.parse_args(argv)
    files = {p.stem: count(p) for p in sorted(GRAPH_DIR.glob("*.py"))}
    backends = {}
    for backend, module in BACKEND_MODULES.items():
        modules = sorted(closure(module))
        backends[backend] = {
            "own": files[module],
            "with_shared": {k: sum(files[m][k] for m in modules) for k in ("lines", "code")},
            "modules": modules,
        }
    report = {"bench": "size", "env": environment(), "files": files, "backends": backends,
              "reference": {"sglang_breakable": 521, "sglang_tc_piecewise": 1771}}  # fmt: skip
    write(args.out, report)
    for backend, r in backends.items():
        shared = r["with_shared"]
        print(f"{backend:<13} own {r['own']['lines']:>4} lines; with shared graph modules "
              f"{shared['lines']:>5} lines ({shared['code']} code)")  # fmt: skip
    print("SGLang, as its CUDA-graph write-up reports: breakable 521 lines, tc_piecewise 1,771")
    return 0
