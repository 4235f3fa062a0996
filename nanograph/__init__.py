"""nanograph: a compact LLM inference engine built around CUDA graphs.

Importing the package is cheap: the engine (and torch's heavier pieces) load on first use of
``LLM`` or ``SamplingParams``.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "StructuredOutputs", "__version__"]


def __getattr__(name: str):
    if name == "LLM":
        from nanograph.engine.llm import LLM

        return LLM
    if name == "SamplingParams":
        from nanograph.engine.sampling_params import SamplingParams

        return SamplingParams
    if name == "StructuredOutputs":
        from nanograph.engine.sampling_params import StructuredOutputs

        return StructuredOutputs
    raise AttributeError(f"module 'nanograph' has no attribute {name!r}")
