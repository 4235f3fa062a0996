"""The GPU's clock and power while a bench times something, from ``nvidia-smi``.

Why: a compute-bound run can hold the GPU at its power limit, where the SM clock drops well
below its maximum and every compute-bound kernel slows with it. On the H200 (700 W), qwen3-0.6b's
8k prefill back to back ran at 1725-1785 MHz and 690-694 W: 32.2 ms a forward, against 29.1 ms
for the same forward after a pause at 1980 MHz (stop 45). A prefill latency without the clock
it ran at is half a number, so ``bench prefill`` records it beside its samples.

Invariant: sampling never changes what is timed beyond one ``nvidia-smi`` process polling the
driver; where ``nvidia-smi`` or a CUDA device is missing the sampler records nothing.
"""

from __future__ import annotations

import select
import shutil
import statistics
import subprocess
from types import TracebackType

import torch

QUERY = "clocks.sm,power.draw,clocks_throttle_reasons.active"
# NVML's clock event reasons (nvidia-smi -q -d PERFORMANCE lists them)
POWER_CAP = 0x4  # software power cap: the board's power limit
HW_SLOWDOWN = 0x8 | 0x40 | 0x80  # hardware slowdown, hardware thermal, power brake
SW_THERMAL = 0x20
START_TIMEOUT_S = 5.0


class ClockSampler:
    """``with ClockSampler() as clocks: ...`` polls the GPU every ``period_ms`` while the block
    runs; ``clocks.summary()`` afterwards: median SM clock (MHz) and power draw (W), and the
    fractions of samples the power cap, thermal limits or hardware slowdowns held the clock
    down. The clock and the reasons are the moment's; the power is the driver's running
    average (~1 s on the H200), so a short block reads below its peak. Empty where there is
    nothing to sample, or with ``period_ms`` 0. ``command`` replaces the ``nvidia-smi``
    executable (tests)."""

    def __init__(
        self, device: torch.device | None = None, period_ms: int = 20, command: str | None = None
    ) -> None:
        self.command = command or shutil.which("nvidia-smi")
        self.period_ms = period_ms
        self.gpu: str | None = None
        if command is not None:
            self.gpu = "0"
        elif self.command is not None and torch.cuda.is_available():
            index = (device or torch.device("cuda")).index or 0
            # the UUID, not the index: nvidia-smi ignores CUDA_VISIBLE_DEVICES
            uuid = str(torch.cuda.get_device_properties(index).uuid)
            self.gpu = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
        self._process: subprocess.Popen | None = None
        self._lines: list[str] = []

    def __enter__(self) -> ClockSampler:
        if self.command is not None and self.gpu is not None and self.period_ms > 0:
            self._process = subprocess.Popen(
                [self.command, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
                 f"--id={self.gpu}", f"--loop-ms={self.period_ms}"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            )  # fmt: skip
            # nvidia-smi takes a few hundred ms to start: wait for its first row (taken before
            # the block, so left out) so that the block's own rows are all sampled
            ready, _, _ = select.select([self._process.stdout], [], [], START_TIMEOUT_S)
            if ready:
                self._process.stdout.readline()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:  # fmt: skip
        if self._process is None:
            return
        self._process.terminate()
        try:
            out, _ = self._process.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            out, _ = self._process.communicate()
        self._lines = out.splitlines()
        self._process = None

    def summary(self) -> dict[str, float]:
        return summarize(self._lines)


def summarize(lines: list[str]) -> dict[str, float]:
    """Medians and fractions (see ``ClockSampler``) of nvidia-smi's CSV rows; rows it could
    not read (a field "[N/A]", a line cut short by the stop) are left out."""
    samples = []
    for line in lines:
        fields = [f.strip() for f in line.split(",")]
        try:
            samples.append((float(fields[0]), float(fields[1]), int(fields[2], 16)))
        except (ValueError, IndexError):
            continue
    if not samples:
        return {}

    def share(mask: int) -> float:
        return sum(1 for *_, reasons in samples if reasons & mask) / len(samples)

    return {
        "sm_mhz": statistics.median(mhz for mhz, _, _ in samples),
        "power_w": statistics.median(watts for _, watts, _ in samples),
        "power_capped": share(POWER_CAP),
        "thermal": share(SW_THERMAL),
        "hw_slowdown": share(HW_SLOWDOWN),
        "samples": len(samples),
    }
