"""Prompt forms and their token ids: the one place a user's prompt is checked and tokenised.

A prompt is a string (raw completion), a list of token ids, a conversation (a list of
``{"role": str, "content": str}`` messages rendered with the model's chat template), or vLLM's
prompt dicts: ``{"prompt": str}`` (TextPrompt) and ``{"prompt_token_ids": [int, ...]}``
(TokensPrompt). A dict is always one prompt, never iterated as its keys.

Invariant: ``prompt_token_ids`` either returns a non-empty list of Python ints or raises
``ValueError`` with a message that names what is wrong and what to give instead. Errors of the
tokenizer and of the chat template (a jinja exception, a lone surrogate the tokenizer cannot
encode) become that ``ValueError``, so a bad prompt fails its own request and nothing else.
Whether the ids are inside the vocabulary and fit the context is the engine's check.
"""

from __future__ import annotations

import json
import operator
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from nanograph.loader.tokenizer import Tokenizer

Message = dict[str, Any]
Prompt = str | list[int] | list[Message] | dict[str, Any]
# vLLM's prompt dicts: the text, or the token ids (which win where both are given, as in vLLM)
_PROMPT_KEYS = ("prompt", "prompt_token_ids")


def is_single_prompt(prompts: Any) -> bool:
    """Whether ``generate``'s argument is one prompt (rather than a batch of prompts)."""
    if isinstance(prompts, str | dict):
        return True
    if not isinstance(prompts, list) or not prompts:
        return False
    if _plain_ints(prompts):
        return True
    if all(_is_token(t) for t in prompts):
        return True
    # a conversation, unless every dict is one of vLLM's prompt dicts (then: a batch of them)
    return all(isinstance(m, dict) for m in prompts) and not all(map(_is_prompt_dict, prompts))


def _is_prompt_dict(value: Any) -> bool:
    return isinstance(value, dict) and "role" not in value and any(k in value for k in _PROMPT_KEYS)


def prompt_token_ids(
    tokenizer: Tokenizer | None,
    prompt: Any,
    chat_template_kwargs: dict[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    """``chat_template_kwargs``: variables for the chat template when the prompt is a
    conversation (vLLM's, e.g. ``{"enable_thinking": False}`` for Qwen3); ``tools``: the
    template's tool definitions (OpenAI's ``tools``), None for none."""
    if isinstance(prompt, dict):
        return prompt_token_ids(tokenizer, _unwrap(prompt), chat_template_kwargs, tools)
    if isinstance(prompt, list | tuple) and prompt and _plain_ints(prompt):
        return list(prompt)
    if isinstance(prompt, list | tuple) and prompt and all(_is_token(t) for t in prompt):
        return [operator.index(t) for t in prompt]
    if isinstance(prompt, list | tuple) and not prompt:
        raise ValueError("the prompt is empty: give at least one token or message")
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("the prompt is empty: give at least one token")
        _check_text("the prompt", prompt)
        return _encode(_need(tokenizer), prompt)
    if isinstance(prompt, list | tuple) and all(isinstance(m, dict) for m in prompt):
        for i, message in enumerate(prompt):
            _check_message(i, message)
        check_tools(tools)
        return _render(_need(tokenizer), list(prompt), chat_template_kwargs or {}, tools)
    raise ValueError(
        "a prompt must be a non-empty string, a list of integer token ids or a list of "
        f"{{'role', 'content'}} messages, got {_describe(prompt)}"
    )


def prompt_text(prompt: Any) -> str | None:
    """The text of a text prompt (a string, or a prompt dict whose ids do not win), else
    None (token ids, a conversation): vLLM's ``RequestOutput.prompt``."""
    if _is_prompt_dict(prompt) and "prompt_token_ids" not in prompt:
        prompt = prompt["prompt"]
    return prompt if isinstance(prompt, str) else None


def _plain_ints(values: list | tuple) -> bool:
    """Whether every value is a Python int (not a bool, not another integer type): the usual
    token list, checked in one C-level pass (a per-token check cost ~0.1 ms per 1k tokens of
    a prefill's latency)."""
    return set(map(type, values)) == {int}


# From this many ids, the vocabulary check runs as one C-level pass over the types and numpy's
# min and max (8k ids: ~0.3 against ~0.9 ms on the 2-core development CPU, on a prefill's
# latency); shorter prompts take the plain walk
VECTOR_CHECK_FROM = 64


def first_bad_token(ids: list, vocab: int) -> int | None:
    """The index of the first entry of ``ids`` that is not a token of a ``vocab``-sized
    vocabulary (not a Python int, or outside 0..vocab-1), or None when every entry is one."""
    if len(ids) >= VECTOR_CHECK_FROM and _plain_ints(ids):
        try:
            rows = np.fromiter(ids, np.int64, len(ids))
        except OverflowError:  # a Python int past int64: the walk below names it
            pass
        else:
            if rows.min() >= 0 and rows.max() < vocab:
                return None
    return next((i for i, t in enumerate(ids) if type(t) is not int or not 0 <= t < vocab), None)


def _unwrap(prompt: dict) -> Any:
    """The prompt inside one of vLLM's prompt dicts; a ValueError for any other dict."""
    keys = sorted(map(str, prompt))
    if not _is_prompt_dict(prompt):
        raise ValueError(
            "a prompt dict takes 'prompt' (text) or 'prompt_token_ids' (a list of token ids), "
            f"got the keys {keys}; a conversation is a list of {{'role', 'content'}} dicts"
        )
    other = [k for k in keys if k not in _PROMPT_KEYS]
    if other:
        raise ValueError(f"{', '.join(other)} in a prompt dict is not supported: give only "
                         "'prompt' or 'prompt_token_ids'")  # fmt: skip
    if "prompt_token_ids" in prompt:
        ids = prompt["prompt_token_ids"]
        if not isinstance(ids, list | tuple):
            raise ValueError(f"prompt_token_ids must be a list of token ids, got {_describe(ids)}")
        return ids
    text = prompt["prompt"]
    if not isinstance(text, str):
        raise ValueError(f"'prompt' must be a string, got {_describe(text)}")
    return text


def _is_token(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def _need(tokenizer: Tokenizer | None) -> Tokenizer:
    if tokenizer is None:
        raise ValueError(
            "this model has no tokenizer (dummy weights): pass prompts as lists of token ids"
        )
    return tokenizer


def _check_text(what: str, text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"{what} is not valid Unicode text: {e.reason} at position {e.start} "
            f"({text[e.start : e.end]!r}); remove or replace that character"
        ) from None


def _check_message(i: int, message: dict) -> None:
    role, content = message.get("role"), message.get("content")
    if not isinstance(role, str) or not role:
        raise ValueError(
            f"message {i} needs a 'role' string (system, user or assistant), got {role!r}"
        )
    if not isinstance(content, str):
        raise ValueError(f"message {i} needs a 'content' string, got {_describe(content)}")
    _check_text(f"message {i}'s content", content)


def _encode(tokenizer: Tokenizer, text: str) -> list[int]:
    try:
        ids = tokenizer.encode(text)
    except Exception as e:  # the tokenizer's own refusal, whatever its type
        raise ValueError(f"the tokenizer cannot encode the prompt: {e}") from None
    if not ids:
        raise ValueError("the prompt encodes to no tokens: give some text")
    return ids


def truncate(prompt_ids: list[int], keep: int | None, max_model_len: int) -> list[int]:
    """The prompt's last ``keep`` tokens (``SamplingParams.truncate_prompt_tokens``; -1: as
    many as the context holds with room for one answer token; None: all of them)."""
    if keep is None:
        return prompt_ids
    keep = max_model_len - 1 if keep == -1 else keep
    return prompt_ids[-keep:] if keep > 0 else []


def check_tools(tools: Any) -> None:
    """OpenAI's ``tools``: a list of ``{"type": "function", "function": {"name": str, ...}}``
    (``parameters``, where given, an object); None for none."""
    if tools is None:
        return
    if not isinstance(tools, list | tuple):
        raise ValueError(f"tools must be a list of function tools, got {_short(tools)}")
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        ok = isinstance(tool, dict) and tool.get("type") == "function"
        ok = ok and isinstance(name, str) and bool(name)
        if not ok or not isinstance(function.get("parameters", {}), dict):
            raise ValueError(
                f'tools[{i}] must be {{"type": "function", "function": {{"name": str, '
                f'"parameters": object, ...}}}}, got {_short(tool)}'
            )


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=repr)
    return text if len(text) <= 80 else text[:77] + "..."


def _render(
    tokenizer: Tokenizer, messages: list[Message], kwargs: dict[str, Any], tools: list | None
) -> list[int]:
    if not tokenizer.has_chat_template:
        raise ValueError(
            "this model's tokenizer has no chat template: send a plain string prompt instead"
        )
    taken = kwargs and tokenizer.chat_template_conflicts(kwargs)
    if taken:
        raise ValueError(
            f"chat_template_kwargs cannot set {', '.join(map(repr, taken))}: arguments of "
            "apply_chat_template itself; give the template's variables only"
        )
    try:
        ids = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tools=tools, **kwargs
        )
    except Exception as e:  # jinja errors (a template's raise_exception), tokenizer errors
        raise ValueError(f"the chat template cannot render these messages: {e}") from None
    if not ids:
        raise ValueError("the conversation renders to no tokens")
    return list(ids)


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"
