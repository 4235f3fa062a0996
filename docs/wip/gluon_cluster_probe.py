"""Can Triton 3.6's Gluon exchange data between the CTAs of a thread-block cluster on sm_90?
(stop 72; compiles only, no GPU: ``PYTHONPATH=/tmp/t36 python3 docs/wip/gluon_cluster_probe.py``
with Triton 3.6 installed there, as the CPU machine's notes say.)

Why: stop 71 (``gluon_chain_probe.py``) left issue 18's batch-1 decode needing hand-offs under
~1 us while HBM streams, e.g. clusters exchanging rows through distributed shared memory
(DSMEM) with one global arrival a cluster, and said Gluon 3.6 has no cluster API. It has part
of one: a ``num_ctas`` launch option and a ``cga_layout`` on distributed layouts (bases that
split a tensor's dimensions over a cluster's CTAs). Three kernels over a [2, N] tensor whose
row r lives in CTA r of a 2-CTA cluster:
- ``local``: each CTA scales its own row (no exchange);
- ``gather``: both rows to every CTA (``convert_layout`` to a layout without the CTA split: a
  DSMEM exchange);
- ``reduce``: the sum over the rows (a cross-CTA reduction), stored from a plain layout.
Prints, for each, whether it compiled and the PTX's cluster instructions.

RESULT (CPU machine, Triton 3.6.0): ``local`` compiles (one ``%cluster_ctarank`` read, no
``mapa``, no ``shared::cluster``, no ``barrier.cluster``); ``gather`` fails in Gluon's front
end (comparing two layouts that carry a ``cga_layout`` raises inside ``tl.tuple``), and
``reduce`` reaches the LLVM lowering and fails there (``ConvertTritonGPUToLLVM``). So a DSMEM
hand-off is not expressible in Gluon 3.6; it would be inline PTX (``mapa.shared::cluster``,
``st.shared::cluster``, ``barrier.cluster.arrive/wait``) inside a ``num_ctas`` launch.
"""

import re

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource

N = 1024


@gluon.jit
def _probe(x_ptr, out_ptr, N: gl.constexpr, MODE: gl.constexpr):
    split: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [1, 4], [1, 0], [[1, 0]])
    rows = gl.arange(0, 2, layout=gl.SliceLayout(1, split))
    cols = gl.arange(0, N, layout=gl.SliceLayout(0, split))
    offs = gl.expand_dims(rows, 1) * N + gl.expand_dims(cols, 0)
    x = gl.load(x_ptr + offs)
    if MODE == 0:  # local: each CTA its own row
        gl.store(out_ptr + offs, x * 2.0)
    elif MODE == 1:  # gather: every CTA both rows
        whole: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [1, 4], [1, 0], [[0, 0]])
        y = gl.convert_layout(x, whole)
        r = gl.arange(0, 2, layout=gl.SliceLayout(1, whole))
        c = gl.arange(0, N, layout=gl.SliceLayout(0, whole))
        gl.store(out_ptr + gl.expand_dims(r, 1) * N + gl.expand_dims(c, 0), y)
    else:  # reduce: the sum over the CTAs' rows
        plain: gl.constexpr = gl.BlockedLayout([4], [32], [4], [0], [[0]])
        s = gl.convert_layout(gl.sum(x, axis=0), plain)
        gl.store(out_ptr + gl.arange(0, N, layout=plain), s)


def main() -> None:
    signature = {"x_ptr": "*fp32", "out_ptr": "*fp32", "N": "constexpr", "MODE": "constexpr"}
    for mode, name in enumerate(("local", "gather", "reduce")):
        source = GluonASTSource(fn=_probe, signature=signature, constexprs={(2,): N, (3,): mode})
        try:
            compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                                      options={"num_warps": 4, "num_ctas": 2})  # fmt: skip
        except Exception as e:  # a failure is the finding
            print(f"{name}: does not compile ({type(e).__name__})")
            continue
        ptx = compiled.asm["ptx"]
        marks = ("%cluster_ctarank", "mapa", "shared::cluster", "barrier.cluster")
        found = {p: len(re.findall(re.escape(p), ptx)) for p in marks}
        print(f"{name}: compiles; PTX {found}")


if __name__ == "__main__":
    main()
