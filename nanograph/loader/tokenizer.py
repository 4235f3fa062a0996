"""Tokenizer: a Hugging Face fast tokenizer built from a GGUF file or an HF folder.

Invariants:
- Never downloads: transformers is called with ``local_files_only=True``. A GGUF tokenizer is
  converted by transformers from the file's metadata (seconds for a 49k vocabulary), then saved
  under ``$NANOGRAPH_CACHE_DIR`` (default ``~/.cache/nanograph``), keyed by the file's path, size
  and mtime and the transformers version, so later start-ups load it in a fraction of a second.
  An unwritable cache is skipped, never an error.
- ``apply_chat_template`` renders the model's own template (GGUF metadata or tokenizer_config)
  and encodes the text without adding special tokens: the template already holds them, exactly
  as transformers' ``apply_chat_template(tokenize=True)`` does.
- ``transformers`` and ``tokenizers`` are imported inside functions.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nanograph.loader.errors import ModelLoadError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class IncrementalDecoder:
    """Text of one generated sequence, token by token: ``step`` returns the new text (possibly
    empty while a multi-byte character is still incomplete). Wraps ``tokenizers``' DecodeStream,
    so the concatenated steps equal ``Tokenizer.decode`` of all the ids."""

    def __init__(self, backend: Any, skip_special_tokens: bool) -> None:
        from tokenizers.decoders import DecodeStream

        self._backend = backend
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)

    def step(self, token_id: int) -> str:
        return self._stream.step(self._backend, token_id) or ""


class Tokenizer:
    """Encode/decode and chat templating for one model."""

    def __init__(
        self, hf_tokenizer: PreTrainedTokenizerBase, *, extra_eos_token_ids: Iterable[int] = ()
    ) -> None:
        self.hf = hf_tokenizer
        eos = [] if hf_tokenizer.eos_token_id is None else [int(hf_tokenizer.eos_token_id)]
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys([*eos, *extra_eos_token_ids]))
        self.bos_token_id: int | None = hf_tokenizer.bos_token_id

    @classmethod
    def from_gguf(
        cls, path: str | os.PathLike[str], *, extra_eos_token_ids: Iterable[int] = ()
    ) -> Tokenizer:
        """Built by transformers' GGUF tokenizer conversion from the file's metadata."""
        path = Path(path).resolve()
        cached = _cache_dir(path)
        if cached is not None and (cached / "tokenizer.json").is_file():
            return cls(_auto_tokenizer(str(cached)), extra_eos_token_ids=extra_eos_token_ids)
        hf = _auto_tokenizer(str(path.parent), gguf_file=path.name)
        if not hf.chat_template:
            # older transformers releases do not carry the template over from GGUF metadata
            from nanograph.loader.gguf import open_gguf

            field = open_gguf(path).fields.get("tokenizer.chat_template")
            hf.chat_template = None if field is None else field.contents()
        if cached is not None:
            _save_atomically(hf, cached)
        return cls(hf, extra_eos_token_ids=extra_eos_token_ids)

    @classmethod
    def from_hf_folder(
        cls, folder: str | os.PathLike[str], *, extra_eos_token_ids: Iterable[int] = ()
    ) -> Tokenizer:
        return cls(_auto_tokenizer(str(folder)), extra_eos_token_ids=extra_eos_token_ids)

    @property
    def vocab_size(self) -> int:
        """Number of tokens the tokenizer knows (may be below the model's embedding rows)."""
        return len(self.hf)

    @property
    def has_chat_template(self) -> bool:
        return bool(self.hf.chat_template)

    def set_chat_template(self, template: str) -> None:
        """The model's chat template replaced by ``template``: the template's text, or the
        path of a file holding it (as vLLM's and SGLang's ``--chat-template`` take it). A
        template that does not parse is refused here, not at the first chat request."""
        import jinja2

        # what apply_chat_template compiles with (its loopcontrols and {% generation %} tags)
        from transformers.utils.chat_template_utils import _compile_jinja_template

        path = Path(template).expanduser()
        if path.is_file():
            template = path.read_text()
        elif not any(c in template for c in "{}\n"):  # meant as a path: no template is so bare
            raise ModelLoadError(f"chat_template: no such file {template!r}")
        try:
            _compile_jinja_template(template)
        except jinja2.TemplateSyntaxError as e:
            raise ModelLoadError(f"chat_template does not parse: {e} (line {e.lineno})") from None
        self.hf.chat_template = template

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens`` adds BOS if the tokenizer asks for it."""
        return list(self.hf.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def decode_stream(self, skip_special_tokens: bool = True) -> IncrementalDecoder:
        """A fresh incremental decoder for one generated sequence."""
        return IncrementalDecoder(self.hf.backend_tokenizer, skip_special_tokens)

    def render_chat(
        self,
        messages: Sequence[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[dict[str, Any]] | None = None,
        **template_kwargs: Any,
    ) -> str:
        """The chat template applied to ``messages`` as text; ``tools``: OpenAI-style tool
        definitions for templates that render them (others ignore them); ``template_kwargs``
        are the template's own variables (vLLM's ``chat_template_kwargs``, e.g. Qwen3's
        ``enable_thinking``): see ``chat_template_conflicts``."""
        if not self.has_chat_template:
            raise ModelLoadError(
                "this model's tokenizer has no chat template: pass a plain text prompt or token "
                "ids instead of chat messages"
            )
        return self.hf.apply_chat_template(
            list(messages), tools=None if tools is None else list(tools), tokenize=False,
            add_generation_prompt=add_generation_prompt, **template_kwargs,
        )  # fmt: skip

    def chat_template_conflicts(self, names: Iterable[str]) -> list[str]:
        """Those of ``names`` that are arguments of transformers' ``apply_chat_template``
        itself (``tokenize``, ``tools``, ...), not template variables: sorted."""
        import inspect

        parameters = inspect.signature(self.hf.apply_chat_template).parameters.values()
        own = {p.name for p in parameters if p.kind is not inspect.Parameter.VAR_KEYWORD}
        return sorted(set(names) & own)

    def apply_chat_template(
        self,
        messages: Sequence[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[dict[str, Any]] | None = None,
        **template_kwargs: Any,
    ) -> list[int]:
        """Token ids of the rendered chat, ending with the assistant header when
        ``add_generation_prompt`` is true."""
        text = self.render_chat(messages, add_generation_prompt, tools, **template_kwargs)
        return self.encode(text, False)


def _cache_dir(gguf: Path) -> Path | None:
    """Where the converted tokenizer of ``gguf`` lives (None when the file cannot be stat'ed)."""
    import hashlib

    import transformers

    try:
        st = gguf.stat()
    except OSError:
        return None
    key = f"{gguf}|{st.st_size}|{st.st_mtime_ns}|{transformers.__version__}"
    root = Path(os.environ.get("NANOGRAPH_CACHE_DIR", Path.home() / ".cache" / "nanograph"))
    return root / "tokenizers" / hashlib.sha256(key.encode()).hexdigest()[:24]


def _save_atomically(hf: PreTrainedTokenizerBase, target: Path) -> None:
    """Save to a sibling temp folder and rename, so a reader never sees half a cache entry."""
    import shutil
    import tempfile

    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-"))
        hf.save_pretrained(tmp)
        try:
            tmp.rename(target)
        except OSError:  # another process saved it first
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError:
        pass  # read-only home, full disk: convert again next time


def _auto_tokenizer(folder: str, **kwargs: Any) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(folder, local_files_only=True, **kwargs)
    except (OSError, ValueError, KeyError) as e:
        where = os.path.join(folder, kwargs.get("gguf_file", ""))
        raise ModelLoadError(f"cannot build a tokenizer from {where}: {e}") from e
