"""The paged KV cache: one k and one v tensor per layer, and a page allocator.

Invariants:
- Layer tensors are ``[num_pages * page_size, num_kv_heads, head_dim]``; token t of a request
  lives at slot ``pages[t // page_size] * page_size + t % page_size``.
- Page 0 is never handed out: it is scratch for padded rows of graph batches, so a padded
  request can point its page table at it without touching a live request's KV.
"""

from __future__ import annotations

import torch

from nanograph.arith import ceil_div
from nanograph.models.config import ModelConfig


def bytes_per_token(config: ModelConfig, dtype: torch.dtype) -> int:
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * element


class PageAllocator:
    def __init__(self, num_pages: int) -> None:
        if num_pages < 2:
            raise ValueError("the KV pool needs at least 2 pages (page 0 is scratch)")
        self.num_pages = num_pages
        self._free = list(range(num_pages - 1, 0, -1))  # pop() hands out low pages first

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_usable(self) -> int:
        return self.num_pages - 1

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise MemoryError(f"KV pool exhausted: need {n} pages, {len(self._free)} free")
        return [self._free.pop() for _ in range(n)]

    def free(self, pages: list[int]) -> None:
        self._free.extend(reversed(pages))


class KVCache:
    def __init__(
        self,
        config: ModelConfig,
        num_pages: int,
        page_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.page_size = page_size
        self.num_pages = num_pages
        shape = (num_pages * page_size, config.num_key_value_heads, config.head_dim)
        # A slot is always written before it is read. On CUDA the zero fill is one fast memset
        # and keeps stray reads (a capture's dummy batch) finite; on CPU, zeroing the default
        # 512 MiB pool took 0.9 s of start-up, while empty pages cost nothing until written.
        alloc = torch.zeros if device.type == "cuda" else torch.empty
        layers = config.num_hidden_layers
        self.k = [alloc(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.v = [alloc(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.allocator = PageAllocator(num_pages)
        self.nbytes = sum(t.numel() * t.element_size() for t in self.k + self.v)

    @property
    def capacity_tokens(self) -> int:
        return self.allocator.num_usable * self.page_size

    def pages_needed(self, num_tokens: int) -> int:
        return ceil_div(num_tokens, self.page_size)
