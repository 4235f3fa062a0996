"""Structured outputs (vLLM's ``structured_outputs``, OpenAI's ``response_format``): each
request's output kept inside a JSON schema, any JSON object, a regex, a choice of strings, an
EBNF grammar or a structural tag (free text with constrained tags), by xgrammar (the library
vLLM and SGLang use): a grammar compiled once per form (xgrammar caches them), a matcher per
request that says which tokens may come next.

Invariants:
- A request's matcher has accepted its resolved output tokens and at most one more: the token
  in flight, read ahead (``advance``). The mask for the next token is filled on the host, so
  the token before must be read first: under the overlap schedule the engine launches the next
  forward, then reads the step in flight while it runs, then masks and samples (its ``step``
  says so); the GPU waits only if the host's reading outlasts the forward.
- A row of a request whose token in flight ended it is computed in vain and gets no mask.
- Disallowed tokens get -inf in a copy of the logits (the raw logits stay the logprobs'), on
  the logits' device: the packed bitmask goes over, unpacked there.
- When the form is complete and only an end token could follow, the request finishes
  (``stop``) without a step to sample that token: it needs no EOS in the vocabulary.
- A token the matcher refuses (it cannot be sampled under the mask; a bug if it happens) fails
  that request alone.
- A form is parsed when its request is admitted (the user's mistakes come back at once) and
  compiled on a worker thread (xgrammar releases the GIL; 6-33 ms a new schema, ~0.1-0.2 s
  more for the first one's tokenizer tables): the engine's loop, and every other request's
  step, never wait for a compile. The engine schedules the request once ``compiled`` has
  given it its matcher.
- xgrammar is imported on first use: requests without a form never need it.
"""

from __future__ import annotations

import json
import re
import warnings
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from nanograph.engine.request import Request
    from nanograph.engine.sampling_params import StructuredOutputs
    from nanograph.loader.tokenizer import Tokenizer

INSTALL = "pip install 'nanograph[structured]' (xgrammar)"


# xgrammar's C++ errors begin with its log line's time and source place ("[02:06:17]
# /project/cpp/json_schema_converter.cc:5082: "), which say nothing to the user
_LOG_PREFIX = re.compile(r"^\[\d\d:\d\d:\d\d\] \S+:\d+: ")


def _compile_error(e: Exception) -> str:
    return f"structured_outputs could not be compiled: {_LOG_PREFIX.sub('', str(e)).strip()}"


class Grammars:
    def __init__(self, tokenizer: Tokenizer | None, vocab_size: int, end_ids: set[int]) -> None:
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        # xgrammar's token ids: the tokenizer's own, not the model's padded vocabulary. Ids past
        # the tokenizer's are never allowed; told of them, xgrammar's accept_token takes time
        # with each (19.5 us against 2.7 a token for SmolLM2's 49,152 ids padded to 151,936)
        self.grammar_vocab = min(vocab_size, len(tokenizer.hf)) if tokenizer else vocab_size
        self.end_ids = sorted(t for t in end_ids if t < self.grammar_vocab)
        self._xgrammar: Any = None  # the module, once a form needed it
        self._compiler: Any = None  # made and used on the worker thread only
        self._pool: ThreadPoolExecutor | None = None
        # request id -> the request whose form is compiling and the compile (``compiled``)
        self._compiling: dict[int, tuple[Request, Future]] = {}
        self._matchers: dict[int, Any] = {}  # request id -> its xgrammar GrammarMatcher
        # request id -> what accepting its token in flight gave, read ahead of the rest
        # (``advance``) for the next step's mask: a reason to end, an error, or None
        self._ahead: dict[int, str | Exception | None] = {}
        self._words = (self.grammar_vocab + 31) // 32  # a bitmask row's int32 words
        self._bits: dict[torch.device, torch.Tensor] = {}  # 0..31, on each device used

    def __contains__(self, request: Request) -> bool:
        return request.request_id in self._matchers

    def any_in(self, requests: list[Request]) -> bool:
        return bool(self._matchers) and any(r.request_id in self._matchers for r in requests)

    def admit(self, request: Request) -> str | None:
        """Parses ``request``'s form and starts compiling it (``compiled`` gives it its matcher
        once done); else the problem, for the user."""
        form = request.params.structured_outputs
        if self.tokenizer is None:
            return "structured_outputs needs the model's tokenizer, and it was loaded without one"
        try:
            import xgrammar
        except ImportError:
            return f"structured_outputs needs xgrammar: {INSTALL}"
        try:
            grammar = _parse(xgrammar, form)
        except Exception as e:  # xgrammar's parse errors: the user's form
            return _compile_error(e)
        self._xgrammar = xgrammar
        if self._pool is None:  # one worker: xgrammar's compiler runs its own threads
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="nanograph-grammar")
        self._compiling[request.request_id] = (request, self._pool.submit(self._compile, grammar))
        return None

    def _compile(self, grammar: Any) -> Any:
        """On the worker thread: the compiled grammar (the compiler is made on first use)."""
        if self._compiler is None:
            xgrammar = self._xgrammar
            info = xgrammar.TokenizerInfo.from_huggingface(
                self.tokenizer.hf, vocab_size=self.grammar_vocab,
                stop_token_ids=self.end_ids or None,
            )  # fmt: skip
            self._compiler = xgrammar.GrammarCompiler(info)
        return self._compiler.compile_grammar(grammar)

    def compiling(self, request: Request) -> bool:
        return request.request_id in self._compiling

    @property
    def num_compiling(self) -> int:
        return len(self._compiling)

    def compiled(self) -> list[tuple[Request, str | None]]:
        """The requests whose form has finished compiling since the last call, as (request,
        None) once given their matcher, or (request, the problem)."""
        done: list[tuple[Request, str | None]] = []
        for request_id, (request, future) in list(self._compiling.items()):
            if not future.done():
                continue
            del self._compiling[request_id]
            try:
                grammar = future.result()
            except Exception as e:  # what parsing let through: the user's form still
                done.append((request, _compile_error(e)))
                continue
            self._matchers[request_id] = self._xgrammar.GrammarMatcher(
                grammar, override_stop_tokens=self.end_ids or None
            )
            done.append((request, None))
        return done

    def wait(self, timeout: float) -> None:
        """Until a compile ends or ``timeout`` seconds pass (an engine with nothing else to do)."""
        if self._compiling:
            futures = [future for _, future in self._compiling.values()]
            wait(futures, timeout, return_when=FIRST_COMPLETED)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def mask(self, logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        """``logits`` with each form's disallowed tokens at -inf (row i is ``requests[i]``'s): a
        copy when any row has a form, else ``logits`` itself."""
        if not self._matchers:  # nearly always: a step does not walk its requests for this
            return logits
        # a request whose token in flight ended it has a row here computed in vain (the overlap
        # schedule launched it first): no mask, which could leave nothing to sample
        rows = [
            i for i, r in enumerate(requests)
            if r.request_id in self._matchers and self._ahead.get(r.request_id) is None
        ]  # fmt: skip
        if not rows:
            return logits
        # Pinned host memory and non-blocking copies: a blocking copy would wait for the
        # forward in flight, and the GPU would then idle through the rest of the step's host
        # work. The caching host allocator reuses a pinned block only after its copy has run.
        pin = logits.is_cuda
        packed = torch.full((len(rows), self._words), -1, dtype=torch.int32, pin_memory=pin)
        for k, i in enumerate(rows):
            self._matchers[requests[i].request_id].fill_next_token_bitmask(packed, k)
        allowed = self._unpack(packed.to(logits.device, non_blocking=True))
        index = torch.tensor(rows, pin_memory=pin).to(logits.device, non_blocking=True)
        out = logits.clone()
        out[index] = out[index].masked_fill(~allowed, -torch.inf)
        return out

    def _unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """[rows, words] int32, bit b of word w for token 32 w + b -> [rows, vocab] bool (the
        model's vocabulary; ids past the tokenizer's False)."""
        bits = self._bits.get(packed.device)
        if bits is None:  # once a device: a copy each step would wait for the forward
            bits = self._bits[packed.device] = torch.arange(32, dtype=torch.int32).to(packed.device)
        allowed = ((packed[:, :, None] >> bits) & 1).bool().flatten(1)[:, : self.grammar_vocab]
        if self.grammar_vocab == self.vocab_size:
            return allowed
        return torch.nn.functional.pad(allowed, (0, self.vocab_size - self.grammar_vocab))

    def advance(self, tokens: list[tuple[Request, int]]) -> None:
        """Accepts each request's token in flight ahead of the rest of its reading, for the
        mask of the step launched behind it; ``accept`` then gives what this gave."""
        for request, token in tokens:
            if request.request_id in self._matchers:
                try:
                    self._ahead[request.request_id] = self._accept(request, token)
                except Exception as e:  # raised again where the token is read
                    self._ahead[request.request_id] = e

    def accept(self, request: Request, token: int) -> str | None:
        """Advances ``request``'s matcher by its sampled ``token`` (or gives what ``advance``
        got for it); "stop" when the form is complete and nothing but an end token could
        follow. Raises if the matcher refuses it."""
        if request.request_id in self._ahead:
            ahead = self._ahead.pop(request.request_id)
            if isinstance(ahead, Exception):
                raise ahead
            return ahead
        return self._accept(request, token)

    def _accept(self, request: Request, token: int) -> str | None:
        matcher = self._matchers[request.request_id]
        if not matcher.accept_token(token):
            raise ValueError(f"token {token} does not continue the request's structured output")
        if matcher.is_terminated() or (matcher.is_completed() and self._only_ends(matcher)):
            return "stop"
        return None

    def _only_ends(self, matcher: Any) -> bool:
        packed = torch.full((1, self._words), -1, dtype=torch.int32)
        matcher.fill_next_token_bitmask(packed, 0)
        allowed = self._unpack(packed)[0]
        allowed[self.end_ids] = False
        return not bool(allowed.any())

    def release(self, request_id: int) -> None:
        self._matchers.pop(request_id, None)
        self._ahead.pop(request_id, None)
        compiling = self._compiling.pop(request_id, None)
        if compiling is not None:  # one already running ends unread
            compiling[1].cancel()


def _parse(xgrammar: Any, form: StructuredOutputs) -> Any:
    """The form as an xgrammar ``Grammar``: quick (well under a millisecond for a schema of a
    dozen fields); compiling it against the vocabulary is what takes time."""
    if form.json is not None:
        return xgrammar.Grammar.from_json_schema(form.json)
    if form.json_object:  # a JSON object, as OpenAI's json_object and vLLM's mean it
        return xgrammar.Grammar.from_json_schema('{"type": "object"}')
    if form.regex is not None:
        return xgrammar.Grammar.from_regex(form.regex)
    if form.choice is not None:  # JSON's string escapes are EBNF literals'
        return xgrammar.Grammar.from_ebnf(
            "root ::= " + " | ".join(json.dumps(c) for c in form.choice)
        )
    if form.structural_tag is not None:
        tag = json.loads(form.structural_tag)
        if "structures" not in tag:  # xgrammar's own form
            return xgrammar.Grammar.from_structural_tag(form.structural_tag)
        # vLLM's first form, which it compiles by xgrammar's older call (as vLLM does)
        items = [
            xgrammar.StructuralTagItem(begin=s["begin"], schema=json.dumps(s["schema"]),
                                       end=s["end"])
            for s in tag["structures"]
        ]  # fmt: skip
        with warnings.catch_warnings():  # that call is deprecated in xgrammar, not in vLLM
            warnings.simplefilter("ignore", DeprecationWarning)
            return xgrammar.Grammar.from_structural_tag(items, tag["triggers"])
    return xgrammar.Grammar.from_ebnf(form.grammar)
