"""Hugging Face folders: ``config.json`` plus ``*.safetensors`` (one file or sharded).

Invariants:
- Tensors stream one at a time from memory-mapped safetensors (``safe_open``), so peak host
  memory stays near one tensor, whatever the checkpoint size.
- Names pass through unchanged (they already are Hugging Face names), except two kinds that are
  not weights of the model: rotary ``inv_freq`` buffers of old checkpoints, and ``lm_head.weight``
  of a tied model (some checkpoints save the shared tensor twice).
- An MXFP4 ``<name>_blocks`` / ``<name>_scales`` pair (gpt-oss experts) is yielded once, as
  ``<name>`` with an ``Mxfp4Tensor`` that ``load_weights`` dequantizes on the device (or
  copies as it is, into a model that keeps MXFP4 experts); the two
  halves may sit in different shards.
- Nothing is downloaded: a folder is read from disk or rejected.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import torch

from nanograph.loader.errors import ModelLoadError
from nanograph.loader.mxfp4 import BLOCKS, SCALES, Mxfp4Tensor
from nanograph.models.config import ModelConfig

SAFETENSORS_INDEX = "model.safetensors.index.json"


def is_hf_folder(path: str | os.PathLike[str]) -> bool:
    """A directory with a ``config.json``."""
    return (Path(path) / "config.json").is_file()


def read_hf_config(folder: str | os.PathLike[str]) -> ModelConfig:
    """``ModelConfig`` from ``config.json``; end-of-sequence ids from ``generation_config.json``
    are added (instruct models list their end-of-turn token there)."""
    folder = Path(folder)
    try:
        d = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{folder}/config.json cannot be read: {e}") from e
    try:
        config = ModelConfig.from_hf_dict(d)
    except (KeyError, ValueError) as e:
        raise ModelLoadError(f"{folder}/config.json: {e}") from e
    generation = folder / "generation_config.json"
    if generation.is_file():
        eos = json.loads(generation.read_text()).get("eos_token_id")
        extra = eos if isinstance(eos, list) else ([] if eos is None else [eos])
        merged = tuple(dict.fromkeys([*config.eos_token_ids, *map(int, extra)]))
        config = config.replace(eos_token_ids=merged)
    return config


def safetensors_files(folder: str | os.PathLike[str]) -> list[Path]:
    """The shard files, from the index when there is one, else every ``*.safetensors``."""
    folder = Path(folder)
    index = folder / SAFETENSORS_INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = [folder / name for name in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ModelLoadError(f"{folder}: shards listed in {index.name} are missing: {missing}")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(
            f"{folder} has a config.json but no *.safetensors weights; add them or use "
            "--load-format dummy for random weights"
        )
    return files


def iter_hf_weights(
    folder: str | os.PathLike[str], config: ModelConfig | None = None
) -> Iterator[tuple[str, torch.Tensor | Mxfp4Tensor]]:
    """Yields ``(name, tensor)`` for every weight, shard by shard, in the checkpoint's dtype
    (an MXFP4 pair as one ``Mxfp4Tensor``)."""
    from safetensors import safe_open

    config = config or read_hf_config(folder)
    with ExitStack() as stack:  # memory-mapped: open shards cost address space, not memory
        shards = [
            stack.enter_context(safe_open(str(file), framework="pt", device="cpu"))
            for file in safetensors_files(folder)
        ]
        shard_of = {name: shard for shard in shards for name in shard.keys()}  # noqa: SIM118
        for shard in shards:
            for name in shard.keys():  # noqa: SIM118 - safe_open is not a mapping
                if name.endswith("rotary_emb.inv_freq"):
                    continue
                if name == "lm_head.weight" and config.tie_word_embeddings:
                    continue
                if name.endswith(SCALES) and name.removesuffix(SCALES) + BLOCKS in shard_of:
                    continue  # yielded with its blocks
                if name.endswith(BLOCKS):
                    yield name.removesuffix(BLOCKS), _mxfp4(folder, name, shard_of)
                else:
                    yield name, shard.get_tensor(name)


def _mxfp4(folder: str | os.PathLike[str], blocks: str, shard_of: dict) -> Mxfp4Tensor:
    scales = blocks.removesuffix(BLOCKS) + SCALES
    if scales not in shard_of:
        raise ModelLoadError(
            f"{folder}: {blocks!r} has no {scales!r}: an MXFP4 tensor needs both; the checkpoint "
            "is incomplete"
        )
    try:
        return Mxfp4Tensor(shard_of[blocks].get_tensor(blocks), shard_of[scales].get_tensor(scales))
    except ValueError as e:
        raise ModelLoadError(f"{folder}: {blocks!r}: {e}") from None
