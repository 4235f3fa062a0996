"""Every Triton kernel variant compiles for sm_90 (H100/H200), checked on CPU.

The interpreter tests never run Triton's compiler; this does (tests/sm90_compile.py, in a
fresh process so the kernels are real JIT functions, not interpreted ones). Skipped where
Triton has no NVIDIA backend with its bundled ptxas (e.g. not x86-64 Linux).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest


def _has_nvidia_compiler() -> bool:
    # Found without importing triton here: test_kernels_triton.py must be the first to import
    # it in this process, after setting TRITON_INTERPRET.
    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.submodule_search_locations:
        return False
    root = Path(list(spec.submodule_search_locations)[0])
    ptxas = root / "backends" / "nvidia" / "bin" / "ptxas"
    return ptxas.exists() and os.access(ptxas, os.X_OK)


@pytest.mark.skipif(not _has_nvidia_compiler(), reason="Triton without its NVIDIA ptxas")
def test_every_kernel_variant_compiles_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("sm90_compile.py")
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout + done.stderr[-6000:]
    assert "0 failed" in done.stdout
