"""The one error type loaders raise for bad user input (paths, presets, files, tokenizers).

Invariant: a ``ModelLoadError`` message names the offending thing and says what to do, so the CLI
can print it as-is without a traceback.
"""

from __future__ import annotations


class ModelLoadError(ValueError):
    """A model, weight file or tokenizer that nanograph cannot load, with the fix in the text."""
