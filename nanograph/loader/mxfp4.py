"""MXFP4 checkpoint tensors (the released gpt-oss experts): dequantized as they load, or kept
packed where the model holds MXFP4 experts (``--quantization mxfp4``: ``load_weights`` copies
the pair as it is; ``kernels.moe`` decodes it).

The format (OCP microscaling, as gpt-oss stores it): ``<name>_blocks`` ``[..., out, in / 32,
16]`` uint8 holds two 4-bit E2M1 values a byte (the low nibble first), ``<name>_scales``
``[..., out, in / 32]`` uint8 one power-of-two exponent (E8M0, bias 127) per block of 32.
Dequantized, the pair is the ``[..., in, out]`` tensor a bf16 checkpoint stores under
``<name>`` (transformers' gpt-oss layout), so the rest of the loader treats it as that tensor.

Invariants:
- Dequantization is exact in float32 and bfloat16 (an E2M1 value times a power of two fits
  both) and matches transformers' ``convert_moe_packed_tensors`` bit for bit.
- It runs where the weight goes (the GPU: milliseconds for a layer, where the CPU would take
  seconds), one leading index (an expert) at a time, so its temporaries stay near one
  expert's; only the 4-bit blocks cross from host to device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BLOCKS = "_blocks"
SCALES = "_scales"
BLOCK_SIZE = 32  # values sharing one scale
SCALE_BIAS = 127
# E2M1 by 4-bit code: sign in bit 3, then 0, 0.5 (subnormal), 1, 1.5, 2, 3, 4, 6
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0) + (
    -0.0,
    -0.5,
    -1.0,
    -1.5,
    -2.0,
    -3.0,
    -4.0,
    -6.0,
)


@dataclass(frozen=True)
class Mxfp4Tensor:
    """A ``_blocks`` / ``_scales`` pair standing in for the dense tensor it encodes."""

    blocks: torch.Tensor  # [..., out, in / 32, 16] uint8
    scales: torch.Tensor  # [..., out, in / 32] uint8

    def __post_init__(self) -> None:
        b, s = self.blocks, self.scales
        if b.dtype != torch.uint8 or s.dtype != torch.uint8:
            raise ValueError(f"MXFP4 blocks and scales must be uint8, got {b.dtype} and {s.dtype}")
        if b.ndim < 3 or b.shape[-1] != BLOCK_SIZE // 2 or tuple(b.shape[:-1]) != tuple(s.shape):
            raise ValueError(
                f"MXFP4 blocks {tuple(b.shape)} and scales {tuple(s.shape)} do not pair: expected "
                f"blocks [..., out, groups, {BLOCK_SIZE // 2}] and scales [..., out, groups]"
            )

    @property
    def shape(self) -> torch.Size:
        """The dense tensor's shape: ``[..., in, out]``."""
        *lead, out, groups, _ = self.blocks.shape
        return torch.Size([*lead, groups * BLOCK_SIZE, out])

    def dequantize(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """The dense ``[..., in, out]`` tensor on ``device`` (a transposed view of a contiguous
        ``[..., out, in]`` one: the layout our expert weights keep)."""
        *lead, out, groups, half = self.blocks.shape
        blocks = self.blocks.reshape(-1, out, groups, half)
        scales = self.scales.reshape(-1, out, groups)
        dense = torch.empty(blocks.shape[0], out, groups * BLOCK_SIZE, dtype=dtype, device=device)
        values = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=device)
        for i in range(blocks.shape[0]):
            codes = blocks[i].to(device)
            pairs = torch.stack((values[(codes & 0xF).int()], values[(codes >> 4).int()]), -1)
            exponent = scales[i].to(device).int() - SCALE_BIAS
            dense[i] = torch.ldexp(
                pairs.reshape(out, groups, BLOCK_SIZE), exponent[..., None]
            ).view(out, -1)
        return dense.view(*lead, out, groups * BLOCK_SIZE).transpose(-1, -2)
