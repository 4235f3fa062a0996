"""Per-request sampling settings, validated once at construction.

Invariant: a ``SamplingParams`` that exists is valid. Every field is checked for type, range and
finiteness here, with a message naming the field and what is allowed, so nothing the engine
reads later (the sampler's generators, the stop checks) can raise on a value a user gave.
Numbers are normalised (``temperature`` becomes a float, ``stop`` a tuple of strings).
"""

from __future__ import annotations

import json
import math
import operator
from dataclasses import dataclass, fields, replace
from typing import Any

# torch.Generator.manual_seed takes a 64-bit seed, signed or unsigned
SEED_RANGE = (-(2**63), 2**64 - 1)
# temperatures below this sample greedily (vLLM's rule): dividing logits by a subnormal
# temperature overflows to inf and the draw becomes NaN
GREEDY_BELOW = 1e-5
# most likely alternatives a request may ask for per output token (OpenAI's top_logprobs limit)
MAX_LOGPROBS = 20
MAX_CHOICES = 128  # completions of one prompt (``n``): OpenAI's bound
MAX_BAD_WORDS = 128  # vLLM's bound


@dataclass(frozen=True)
class StructuredOutputs:
    """What the output must match (vLLM's ``StructuredOutputsParams``): exactly one of a JSON
    schema (``json``: a dict or its JSON text), any JSON object (``json_object``), a regular
    expression, one of a list of strings (``choice``), an EBNF grammar (xgrammar's dialect,
    GBNF-like: ``root ::= ...``), or a structural tag (``structural_tag``, a dict or its JSON
    text, as vLLM takes it: free text in which each trigger opens a tag whose content is
    constrained, e.g. a tool call's arguments to their schema; xgrammar's form
    ``{"type": "structural_tag", "format": {...}}``, or vLLM's first form ``{"structures":
    [{"begin", "schema", "end"}, ...], "triggers": [...]}``). ``engine/structured.py``
    compiles it."""

    json: str | dict | None = None
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    json_object: bool = False
    structural_tag: str | dict | None = None

    def __post_init__(self) -> None:
        set_ = lambda name, value: object.__setattr__(self, name, value)
        given = [f.name for f in fields(self) if getattr(self, f.name) not in (None, False)]
        if len(given) != 1:
            raise ValueError(
                "structured_outputs must set exactly one of json, regex, choice, grammar, "
                f"json_object and structural_tag, got {', '.join(given) or 'none'}"
            )
        if self.json is not None:
            schema = self.json
            if isinstance(schema, str):
                try:
                    schema = json.loads(schema)
                except ValueError as e:
                    raise ValueError(f"structured_outputs.json is not JSON: {e}") from None
            if not isinstance(schema, dict):
                raise ValueError("structured_outputs.json must be a JSON schema object, got "
                                 f"{type(schema).__name__}")  # fmt: skip
            try:  # its properties' order is the output's
                set_("json", json.dumps(schema, allow_nan=False))
            except (TypeError, ValueError) as e:  # a value JSON has no form for
                raise ValueError(f"structured_outputs.json is not JSON: {e}") from None
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"structured_outputs.{name} must be a non-empty string, got "
                                 f"{value!r}")  # fmt: skip
        if self.choice is not None:
            set_("choice", _strings("structured_outputs.choice", self.choice))
            if not self.choice:
                raise ValueError("structured_outputs.choice must hold at least one string")
        if not isinstance(self.json_object, bool):
            raise ValueError(f"structured_outputs.json_object must be true or false, got "
                             f"{self.json_object!r}")  # fmt: skip
        if self.structural_tag is not None:
            set_("structural_tag", _structural_tag(self.structural_tag))


def _structural_tag(tag: str | dict) -> str:
    """A structural tag as JSON text, its shape checked: xgrammar's ``format`` (xgrammar
    checks the rest) or vLLM's first form, whose fields xgrammar would take without a word."""
    name = "structured_outputs.structural_tag"
    if isinstance(tag, str):
        try:
            tag = json.loads(tag)
        except ValueError as e:
            raise ValueError(f"{name} is not JSON: {e}") from None
    if not isinstance(tag, dict) or ("format" in tag) == ("structures" in tag):
        raise ValueError(f'{name} must be an object with "format" (xgrammar\'s structural tag) '
                         'or "structures" and "triggers" (vLLM\'s first form)')  # fmt: skip
    if "structures" in tag:
        structures, triggers = tag["structures"], tag.get("triggers")
        if not isinstance(structures, list) or not structures or not all(
            isinstance(s, dict) and isinstance(s.get("begin"), str) and s["begin"]
            and isinstance(s.get("end"), str) and isinstance(s.get("schema"), dict)
            for s in structures
        ):  # fmt: skip
            raise ValueError(f'{name}.structures must be a non-empty list of {{"begin": ..., '
                             '"schema": {...}, "end": ...}')  # fmt: skip
        tag = {**tag, "triggers": list(_strings(f"{name}.triggers", triggers))}
        if not tag["triggers"]:
            raise ValueError(f"{name}.triggers must hold at least one string")
    try:
        return json.dumps(tag, allow_nan=False)
    except (TypeError, ValueError) as e:  # a value JSON has no form for
        raise ValueError(f"{name} is not JSON: {e}") from None


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request. ``temperature == 0`` (or below 1e-5) means greedy.

    ``top_k == -1`` (or 0) disables top-k; ``top_p == 1`` disables nucleus sampling;
    ``min_p == 0`` disables min-p. ``seed`` makes a sampled request reproducible on its own,
    whatever else shares its batch. ``presence_penalty`` and ``frequency_penalty`` (-2..2, 0 =
    off) and ``repetition_penalty`` (> 0, 1 = off) penalise tokens already generated (the
    repetition penalty also those of the prompt); ``logit_bias`` ({token id: -100..100}) is
    added to those tokens' logits, ``allowed_token_ids`` (vLLM's) leaves only those tokens
    possible, ``bad_words`` (vLLM's) keeps the output from writing those words (their
    tokens, as written and after a space), and ``min_tokens`` (vLLM's) keeps EOS and
    ``stop_token_ids`` from being sampled, and stop strings from matching, until that many
    tokens are out: ``engine/penalties.py``. ``logprobs``
    (0..20) returns each output token's log-probability and that many of the most likely
    tokens at its position (None: none); ``prompt_logprobs`` (vLLM's, 0..20) the same for
    each prompt token after the first (``engine/logprobs.py``). ``n`` completions of the
    prompt (vLLM's and OpenAI's ``n``): ``LLM.generate`` and the server run one engine request
    per completion (``choices``), each with ``n == 1``. ``truncate_prompt_tokens`` (vLLM's)
    keeps only the prompt's last that many tokens (-1: as many as the context holds with room
    for one answer token); the engine cuts the prompt when it takes the request.
    ``structured_outputs`` (vLLM's; a ``StructuredOutputs`` or a dict of its fields) keeps
    the output inside a JSON schema, a regex, a choice, a grammar or a structural tag
    (``engine/structured.py``).
    """

    max_tokens: int = 128
    min_tokens: int = 0  # vLLM's: no EOS, stop token or stop string before this many tokens
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # given as a dict or pairs
    allowed_token_ids: tuple[int, ...] | None = None  # vLLM's: the only tokens it may sample
    bad_words: tuple[str, ...] = ()  # vLLM's: words the output may not contain
    logprobs: int | None = None
    prompt_logprobs: int | None = None  # vLLM's: the prompt tokens' log-probabilities
    n: int = 1
    include_stop_str_in_output: bool = False  # vLLM's: the text ends with the stop string
    truncate_prompt_tokens: int | None = None  # vLLM's: keep the prompt's last k tokens
    structured_outputs: StructuredOutputs | None = None  # vLLM's: the output's form

    def __post_init__(self) -> None:
        set_ = lambda name, value: object.__setattr__(self, name, value)
        set_("max_tokens", _integer("max_tokens", self.max_tokens, low=1))
        set_("min_tokens", _integer("min_tokens", self.min_tokens, 0, self.max_tokens,
                                    "at most max_tokens"))  # fmt: skip
        set_("temperature", _real("temperature", self.temperature, low=0.0, hint="0 = greedy"))
        set_("top_k", _integer("top_k", self.top_k, low=-1, hint="-1 or 0 = disabled"))
        set_("top_p", _real("top_p", self.top_p, low=0.0, high=1.0, open_low=True))
        set_("min_p", _real("min_p", self.min_p, low=0.0, high=1.0))
        if self.seed is not None:
            set_("seed", _integer("seed", self.seed, low=SEED_RANGE[0], high=SEED_RANGE[1]))
        set_("stop_token_ids", _int_tuple("stop_token_ids", self.stop_token_ids))
        set_("stop", _strings("stop", self.stop))
        set_("bad_words", _strings("bad_words", self.bad_words))
        if len(self.bad_words) > MAX_BAD_WORDS:
            raise ValueError(f"bad_words holds {len(self.bad_words)} words: at most "
                             f"{MAX_BAD_WORDS}")  # fmt: skip
        for name in ("ignore_eos", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            set_(name, _real(name, getattr(self, name), low=-2.0, high=2.0, hint="0 = off"))
        rep = _real("repetition_penalty", self.repetition_penalty, low=0.0, open_low=True,
                    hint="1 = off")  # fmt: skip
        set_("repetition_penalty", rep)
        set_("logit_bias", _logit_bias(self.logit_bias))
        if self.allowed_token_ids is not None:
            allowed = _int_tuple("allowed_token_ids", self.allowed_token_ids)
            if not allowed:
                raise ValueError("allowed_token_ids must hold at least one token id, got []")
            set_("allowed_token_ids", tuple(sorted(set(allowed))))
        hint = "the most likely alternatives returned per token"
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                set_(name, _integer(name, getattr(self, name), 0, MAX_LOGPROBS, hint))
        set_("n", _integer("n", self.n, 1, MAX_CHOICES, "completions per prompt"))
        if self.truncate_prompt_tokens is not None:
            k = _integer("truncate_prompt_tokens", self.truncate_prompt_tokens, low=-1,
                         hint="-1 = what the context holds")  # fmt: skip
            if k == 0:
                raise ValueError("truncate_prompt_tokens must be -1 or an integer >= 1, got 0")
            set_("truncate_prompt_tokens", k)
        structured = self.structured_outputs
        if isinstance(structured, dict):
            known = {f.name for f in fields(StructuredOutputs)}
            unknown = sorted(set(structured) - known)
            if unknown:
                raise ValueError(f"structured_outputs has no field {unknown[0]!r}: one of "
                                 f"{', '.join(sorted(known))}")  # fmt: skip
            set_("structured_outputs", StructuredOutputs(**structured))
        elif structured is not None and not isinstance(structured, StructuredOutputs):
            raise ValueError("structured_outputs must be a StructuredOutputs or a dict, got "
                             f"{type(structured).__name__}")  # fmt: skip
        if self.structured_outputs is not None and self.min_tokens:
            raise ValueError("min_tokens cannot be combined with structured_outputs: the form "
                             "decides where the output ends")  # fmt: skip

    def choices(self) -> list[SamplingParams]:
        """One engine request's parameters per completion, each with ``n == 1``: completion i
        of a seeded request samples with ``seed + i`` (wrapped into the seed range), so the
        completions differ and each is reproducible."""
        if self.n == 1:
            return [self]
        one = replace(self, n=1)
        if self.seed is None:
            return [one] * self.n
        low, high = SEED_RANGE
        return [replace(one, seed=low + (self.seed - low + i) % (high - low + 1))
                for i in range(self.n)]  # fmt: skip

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @property
    def penalized(self) -> bool:
        return (self.presence_penalty != 0 or self.frequency_penalty != 0
                or self.repetition_penalty != 1)  # fmt: skip

    @property
    def adjusts_logits(self) -> bool:
        """Whether penalties, a logit bias, ``allowed_token_ids``, ``bad_words`` or
        ``min_tokens`` change the logits it samples from."""
        return (self.penalized or bool(self.logit_bias) or self.min_tokens > 0
                or self.allowed_token_ids is not None or bool(self.bad_words))  # fmt: skip


def _integer(name: str, value: Any, low: int, high: int | None = None, hint: str = "") -> int:
    allowed = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
    if hint:
        allowed += f" ({hint})"
    if isinstance(value, bool):
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    try:
        number = operator.index(value)  # ints and numpy integers; never floats or strings
    except TypeError:
        raise ValueError(f"{name} must be {allowed}, got {value!r}") from None
    if number < low or (high is not None and number > high):
        raise ValueError(f"{name} must be {allowed}, got {number}")
    return number


def _real(
    name: str,
    value: Any,
    low: float,
    high: float | None = None,
    open_low: bool = False,
    hint: str = "",
) -> float:
    bracket = "(" if open_low else "["
    allowed = f"a number > {low}" if open_low else f"a number >= {low}"
    if high is not None:
        allowed = f"a number in {bracket}{low}, {high}]"
    if hint:
        allowed += f" ({hint})"
    if isinstance(value, bool | str | bytes) or not hasattr(value, "__float__"):
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name} must be {allowed}, got {value!r}") from None
    too_low = number <= low if open_low else number < low
    if not math.isfinite(number) or too_low or (high is not None and number > high):
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return number


def _int_tuple(name: str, values: Any) -> tuple[int, ...]:
    if isinstance(values, str | bytes) or not hasattr(values, "__iter__"):
        raise ValueError(f"{name} must be a list of token ids, got {values!r}")
    return tuple(_integer(f"{name}[{i}]", v, low=0) for i, v in enumerate(values))


def _strings(name: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = (value,)
    if isinstance(value, bytes) or not hasattr(value, "__iter__"):
        raise ValueError(f"{name} must be a string or a list of strings, got {value!r}")
    strings = tuple(value)
    for i, s in enumerate(strings):
        if not isinstance(s, str) or not s:
            raise ValueError(f"{name}[{i}] must be a non-empty string, got {s!r}")
    return strings


def _logit_bias(bias: Any) -> tuple[tuple[int, float], ...]:
    if bias is None:
        return ()
    if isinstance(bias, dict):
        bias = bias.items()
    if isinstance(bias, str | bytes) or not hasattr(bias, "__iter__"):
        raise ValueError(f"logit_bias must map token ids to numbers, got {bias!r}")
    pairs = {}
    for pair in bias:
        if not isinstance(pair, tuple | list) or len(pair) != 2:
            raise ValueError(f"logit_bias must map token ids to numbers, got {pair!r}")
        token = _integer("logit_bias token id", pair[0], low=0)
        pairs[token] = _real(f"logit_bias[{token}]", pair[1], low=-100.0, high=100.0)
    return tuple(sorted(pairs.items()))
