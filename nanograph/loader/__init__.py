"""Loading models: presets and paths (``resolve_model``), GGUF and Hugging Face weights,
random init, and the tokenizer.

Invariant: importing this package imports neither ``gguf`` nor ``transformers``; they are loaded
by the functions that need them.
"""

from __future__ import annotations

from nanograph.loader.errors import ModelLoadError
from nanograph.loader.gguf import iter_gguf_weights, read_gguf_config
from nanograph.loader.hf import iter_hf_weights, read_hf_config
from nanograph.loader.presets import (
    DEFAULT_MODEL,
    LOAD_FORMATS,
    PRESETS,
    ModelSource,
    resolve_model,
    smollm2_gguf_path,
)
from nanograph.loader.tokenizer import IncrementalDecoder, Tokenizer
from nanograph.loader.weights import HFWeightTargets, init_dummy_weights, load_weights

__all__ = [
    "DEFAULT_MODEL",
    "LOAD_FORMATS",
    "PRESETS",
    "HFWeightTargets",
    "IncrementalDecoder",
    "ModelLoadError",
    "ModelSource",
    "Tokenizer",
    "init_dummy_weights",
    "iter_gguf_weights",
    "iter_hf_weights",
    "load_weights",
    "read_gguf_config",
    "read_hf_config",
    "resolve_model",
    "smollm2_gguf_path",
]
