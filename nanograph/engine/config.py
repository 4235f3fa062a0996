"""Engine settings: one frozen dataclass, validated once, shared by the CLI and ``LLM``.

Every default lives here with its reason; the CLI builds its flags from these fields.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

import torch

from nanograph.attention import ATTENTION_BACKENDS
from nanograph.models.moe import MOE_BACKENDS
from nanograph.spec.ngram import NGRAM_MAX, NGRAM_MIN

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
GRAPH_CHOICES = ("auto", "full", "breakable", "tc_piecewise", "none")
SPECULATIVE_ALGORITHMS = ("ngram", "draft_model")
QUANTIZATIONS = (None, "mxfp4")
# a verify forward holds k+1 tokens per request; past ~16 drafts acceptance of a whole chain is
# rare and the verify forward stops being weight-bound, so larger k only costs
MAX_DRAFT_TOKENS = 16
CAPTURE_CHOICES = ("auto", "startup", "background", "lazy")
LADDER_CHOICES = ("default", "auto")
# What --cuda-graph-capture auto means on CUDA: serve at once and capture while serving (its GPU
# tests, tests/gpu/test_live_capture_gpu.py, passed on the H200 at b04ff55). auto still means
# start-up capture wherever background capture is refused or has nothing to capture
# (EngineConfig.capture_mode).
CAPTURE_DEFAULT_ON_CUDA = "background"
_BYTE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10,
               "mib": 2**20, "gib": 2**30}  # fmt: skip


def _triton_interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# the settings that choose a graph backend, one per path
GRAPH_PATHS = ("decode_cuda_graph", "prefill_cuda_graph", "speculative_draft_cuda_graph")


@dataclass(frozen=True)
class EngineConfig:
    model: str = "smollm2-135m"
    load_format: str = "auto"  # auto | gguf | hf | dummy
    dtype: str = "auto"  # auto = bfloat16 on CUDA, float32 on CPU
    device: str = "auto"  # auto = cuda when available
    # GPU: fraction of total device memory the engine may use (weights + graphs + KV pool)
    mem_fraction: float = 0.85
    # CPU: the KV pool's byte budget (there is no device memory to measure)
    kv_cache_bytes: int = 512 * 2**20
    page_size: int = 16
    # cap on the KV pool's tokens on any device (SGLang's --max-total-tokens); None = what the
    # memory budget allows
    max_total_tokens: int | None = None
    # the largest single prefill forward; also the default prefill capture ceiling
    chunked_prefill_size: int = 8192
    max_num_seqs: int = 256
    max_model_len: int | None = None  # None = the model's context length
    attention_backend: str = "auto"  # auto = triton on CUDA, torch_native on CPU
    # experts of MoE models: auto = triton (graph-safe fused) on CUDA, torch_native on CPU
    moe_backend: str = "auto"
    # weights kept quantized in memory: mxfp4 (gpt-oss' experts, as its checkpoints hold them,
    # decoded by the fused MoE kernels); None = the model's dtype (MXFP4 checkpoints dequantized)
    quantization: str | None = None
    # a Jinja chat template, or the path of a file holding one, in place of the model's own
    chat_template: str | None = None
    seed: int = 0
    progress: bool = True
    # off: the host reads each step's tokens before it schedules the next step (SGLang's flag);
    # on (default): it schedules and launches step t+1 while the device still runs step t
    disable_overlap_schedule: bool = False
    # on (default): prompts reuse the KV pages of cached prefixes (a radix tree over pages)
    disable_prefix_caching: bool = False
    # graph backend per path; auto = full decode + breakable prefill on CUDA (breakable decode
    # too when an attention or MoE backend reads the host), none on CPU
    decode_cuda_graph: str = "auto"
    prefill_cuda_graph: str = "auto"
    # run every captured path as one eager break through the same buffers and replay path
    debug_cuda_graph: bool = False
    # largest decode batch captured (1, 2, 4, 8, then steps of 8)
    cuda_graph_max_bs: int = 256
    # decode batch sizes captured instead of that ladder (SGLang's --cuda-graph-bs)
    cuda_graph_bs: tuple[int, ...] | None = None
    # prefill token buckets; None = ~40 buckets up to chunked_prefill_size
    prefill_graph_tokens: tuple[int, ...] | None = None
    # request slots per prefill graph (SGLang: 16); more requests in one forward run eagerly
    prefill_graph_slots: int = 16
    # speculative decoding: None (off) | "ngram" (prompt lookup) | "draft_model"
    speculative_algorithm: str | None = None
    # drafts proposed per request and step (k); the verify forward holds k+1 tokens
    speculative_num_draft_tokens: int = 4
    # the draft model (same tokenizer as the target): a preset, .gguf or Hugging Face folder
    speculative_draft_model_path: str | None = None
    # ngram: the suffix n-gram matched in the request's own tokens, longest first, of at most
    # max and at least min tokens (SGLang's names; vLLM's prompt_lookup_max / _min)
    speculative_ngram_min_match_window_size: int = NGRAM_MIN
    speculative_ngram_max_match_window_size: int = NGRAM_MAX
    # graph backend of the draft model's runners; auto = as decode_cuda_graph resolves
    speculative_draft_cuda_graph: str = "auto"
    # when graphs are captured: startup (before serving), background (serve at once, capture
    # on a thread, hottest shapes first), lazy (when a batch needs a shape the 2nd time);
    # auto = CAPTURE_DEFAULT_ON_CUDA on CUDA, startup where that is refused (see capture_mode)
    cuda_graph_capture: str = "auto"
    # graph memory budget of background/lazy capture: bytes ("2GiB", "500MB", "2e9") or a
    # fraction of the free memory after the weights ("0.05"); least recently replayed graphs
    # are evicted to stay under it. None = an estimate from the measured activation peak
    cuda_graph_memory: str | None = None
    # default: capture the configured ladders; auto: capture the buckets a padding-cost model
    # picks from the batch sizes seen so far (background or lazy capture only). None = auto
    # under background capture, default otherwise (see ladder_mode)
    cuda_graph_ladder: str | None = None
    # ranks the model is sharded over (one GPU each; gloo processes on CPU); 1 = no sharding
    tensor_parallel_size: int = 1
    # the longest any rank waits for the others (start-up, each collective) before it fails
    # with an error naming the rank; start-up of a large checkpoint must fit in it
    distributed_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.load_format not in ("auto", "gguf", "hf", "dummy"):
            raise ValueError(
                f"load_format must be auto, gguf, hf or dummy, got {self.load_format!r}"
            )
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ValueError(
                f"dtype must be auto or one of {', '.join(DTYPES)}, got {self.dtype!r}"
            )
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be auto, cpu or cuda[:N], got {self.device!r}")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError("device 'cuda' requested but CUDA is not available; use --device cpu")
        if not 0 < self.mem_fraction <= 1:
            raise ValueError(f"mem_fraction must be in (0, 1], got {self.mem_fraction}")
        for name in (
            "page_size", "chunked_prefill_size", "max_num_seqs", "kv_cache_bytes",
            "cuda_graph_max_bs", "prefill_graph_slots", "tensor_parallel_size",
            "distributed_timeout_s",
        ):  # fmt: skip
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.moe_backend not in MOE_BACKENDS:
            raise ValueError(
                f"moe_backend must be one of {', '.join(MOE_BACKENDS)}, got {self.moe_backend!r}"
            )
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(
                f"quantization must be one of {', '.join(map(str, QUANTIZATIONS))}, got "
                f"{self.quantization!r}"
            )
        self._check_speculative()
        for flag in GRAPH_PATHS:
            value = getattr(self, flag)
            if value not in GRAPH_CHOICES:
                raise ValueError(f"{flag} must be one of {', '.join(GRAPH_CHOICES)}, got {value!r}")
            if value not in ("auto", "none") and self.torch_device.type != "cuda":
                raise ValueError(
                    f"{flag}={value!r} needs CUDA, but the engine runs on {self.torch_device}; "
                    "use 'auto' or 'none' (eager) on this machine"
                )
        if self.max_total_tokens is not None and self.max_total_tokens < 1:
            raise ValueError(f"max_total_tokens must be positive, got {self.max_total_tokens}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(
                f"max_model_len must be at least 2 (a prompt token and an answer token), got "
                f"{self.max_model_len}; leave it unset for the model's context length"
            )
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f"attention_backend must be one of {', '.join(ATTENTION_BACKENDS)}, "
                f"got {self.attention_backend!r}"
            )
        cpu = self.torch_device.type != "cuda"
        if cpu and self.attention_backend == "triton" and not _triton_interpreted():
            raise ValueError(
                "attention_backend='triton' needs CUDA, but the engine runs on "
                f"{self.torch_device}; use 'auto' or 'torch_native' on this machine (Triton "
                "runs on CPU only in its interpreter, TRITON_INTERPRET=1, for tests)"
            )
        if cpu and self.moe_backend == "triton" and not _triton_interpreted():
            raise ValueError(
                "moe_backend='triton' needs CUDA, but the engine runs on "
                f"{self.torch_device}; use 'auto' or 'torch_native' on this machine (Triton "
                "runs on CPU only in its interpreter, TRITON_INTERPRET=1, for tests)"
            )
        if cpu and self.debug_cuda_graph:
            raise ValueError(
                "debug_cuda_graph checks CUDA-graph capture, but the engine runs on "
                f"{self.torch_device}, where nothing is captured: drop the flag"
            )
        self._check_capture()
        if self.tensor_parallel_size > 1 and self.device.startswith("cuda:"):
            raise ValueError(
                f"device={self.device!r} names one GPU, but tensor_parallel_size="
                f"{self.tensor_parallel_size} puts rank r on GPU r (set CUDA_VISIBLE_DEVICES to "
                "choose GPUs); use device 'cuda' or 'auto'"
            )
        # explicit ladders: sorted, deduplicated, positive and within what a forward can hold
        self._ladder("cuda_graph_bs", "max_num_seqs", "requests decode at once")
        self._ladder("prefill_graph_tokens", "chunked_prefill_size", "tokens go into one forward")

    def _check_speculative(self) -> None:
        algorithm = self.speculative_algorithm
        if algorithm is not None and algorithm not in SPECULATIVE_ALGORITHMS:
            raise ValueError(
                f"speculative_algorithm must be one of {', '.join(SPECULATIVE_ALGORITHMS)} "
                f"(or unset: off), got {algorithm!r}"
            )
        if not 1 <= self.speculative_num_draft_tokens <= MAX_DRAFT_TOKENS:
            raise ValueError(
                f"speculative_num_draft_tokens must be in 1..{MAX_DRAFT_TOKENS}, got "
                f"{self.speculative_num_draft_tokens}"
            )
        if algorithm is not None and self.capture_mode in ("background", "lazy"):
            raise ValueError(
                "speculative decoding captures its verify and draft graphs at start-up: use "
                f"cuda_graph_capture 'startup' (or 'auto'), not {self.cuda_graph_capture!r}"
            )
        if algorithm is not None and self.tensor_parallel_size > 1:
            raise ValueError(
                "speculative decoding runs on one rank: drop speculative_algorithm or use "
                "tensor_parallel_size=1 (the draft and verify steps are not sent to other ranks)"
            )
        low = self.speculative_ngram_min_match_window_size
        high = self.speculative_ngram_max_match_window_size
        if not 1 <= low <= high:
            raise ValueError(
                "the n-gram window needs 1 <= speculative_ngram_min_match_window_size <= "
                f"speculative_ngram_max_match_window_size, got min {low} and max {high}"
            )
        if (low, high) != (NGRAM_MIN, NGRAM_MAX) and algorithm != "ngram":
            raise ValueError(
                "speculative_ngram_*_match_window_size set but speculative_algorithm is "
                f"{algorithm!r}: add speculative_algorithm='ngram' or drop them"
            )
        path = self.speculative_draft_model_path
        if algorithm == "draft_model" and not path:
            raise ValueError(
                "speculative_algorithm='draft_model' needs speculative_draft_model_path (a "
                "smaller model with the target's tokenizer, e.g. qwen3-0.6b for qwen3-8b)"
            )
        if path and algorithm != "draft_model":
            raise ValueError(
                "speculative_draft_model_path is set but speculative_algorithm is "
                f"{algorithm!r}: add speculative_algorithm='draft_model' or drop the path"
            )

    def _check_capture(self) -> None:
        if self.cuda_graph_capture not in CAPTURE_CHOICES:
            raise ValueError(
                f"cuda_graph_capture must be one of {', '.join(CAPTURE_CHOICES)}, "
                f"got {self.cuda_graph_capture!r}"
            )
        if self.cuda_graph_ladder is not None and self.cuda_graph_ladder not in LADDER_CHOICES:
            raise ValueError(
                f"cuda_graph_ladder must be default or auto, got {self.cuda_graph_ladder!r}"
            )
        if self.cuda_graph_memory is not None:
            parse_graph_memory(self.cuda_graph_memory)
        live = self.capture_mode in ("background", "lazy")
        if self.torch_device.type != "cuda" and (
            self.cuda_graph_capture in ("background", "lazy") or self.cuda_graph_ladder == "auto"
            or self.cuda_graph_memory is not None
        ):  # fmt: skip
            raise ValueError(
                "cuda_graph_capture background/lazy, cuda_graph_ladder auto and "
                f"cuda_graph_memory shape CUDA graphs, but the engine runs on {self.torch_device},"
                " where nothing is captured: drop them"
            )
        if not live and (self.cuda_graph_ladder == "auto" or self.cuda_graph_memory is not None):
            raise ValueError(
                "cuda_graph_ladder auto and cuda_graph_memory need cuda_graph_capture background "
                "or lazy (start-up capture captures the whole configured ladder before serving)"
            )
        if live and self.tensor_parallel_size > 1:
            raise ValueError(
                "cuda_graph_capture background/lazy captures on one rank's own schedule, but with "
                f"tensor_parallel_size={self.tensor_parallel_size} every rank must capture (and "
                "replay) the same graphs together: use cuda_graph_capture startup (or auto)"
            )
        if self.capture_mode == "background" and "tc_piecewise" in (
            self.graph_backend("decode"), self.graph_backend("prefill"),
        ):  # fmt: skip
            raise ValueError(
                "tc_piecewise compiles with torch.compile, which nanograph does not run on a "
                "second thread while the serving thread replays: use cuda_graph_capture lazy, "
                "startup or auto with it, or the full/breakable backends"
            )

    @property
    def capture_mode(self) -> str:
        """When graphs are captured: "startup", "background" or "lazy". An explicit choice is
        kept (and refused where it cannot apply); "auto" is CAPTURE_DEFAULT_ON_CUDA, or
        "startup" where background capture is refused or has nothing to capture."""
        if self.cuda_graph_capture != "auto":
            return self.cuda_graph_capture
        return "startup" if self._startup_capture_only() else CAPTURE_DEFAULT_ON_CUDA

    @property
    def ladder_mode(self) -> str:
        """Which shapes live capture captures: "default" (the configured ladders) or "auto"
        (learned from the batch sizes served). An explicit choice is kept; left unset it is
        "auto" under background capture: measured on the H200 (qwen3-0.6b and qwen3-8b, 16
        requests in flight), the configured ladder captured in the background had not finished
        after 10-15 s of serving (0.5-0.6x of start-up capture's throughput), while the learned
        one reached start-up's throughput within ~3 s of ready with 0.01-0.02x its graph memory
        (docs/capture.md). Lazy capture already captures only what batches need, and start-up
        capture captures the configured ladders by definition."""
        if self.cuda_graph_ladder is not None:
            return self.cuda_graph_ladder
        return "auto" if self.capture_mode == "background" else "default"

    def _startup_capture_only(self) -> bool:
        """Where "auto" means start-up capture: the cases _check_speculative and _check_capture
        refuse background capture in, and engines with no graph to capture."""
        paths = (self.graph_backend("decode"), self.graph_backend("prefill"))
        return (
            self.torch_device.type != "cuda"  # nothing is captured
            or self.speculative_algorithm is not None  # verify and draft graphs: at start-up
            or self.tensor_parallel_size > 1  # every rank captures the same graphs together
            or "tc_piecewise" in paths  # no torch.compile beside the serving thread's replays
            or paths == ("none", "none")  # no graph backend: no capture thread to start
        )

    def _ladder(self, name: str, limit_name: str, what: str) -> None:
        values = getattr(self, name)
        if values is None:
            return
        ladder = tuple(sorted({int(v) for v in values}))
        if not ladder or ladder[0] <= 0:
            raise ValueError(f"{name} must be positive")
        limit = getattr(self, limit_name)
        if ladder[-1] > limit:
            raise ValueError(
                f"{name} go up to {ladder[-1]} but at most {limit_name}={limit} {what}"
            )
        object.__setattr__(self, name, ladder)

    @property
    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if self.torch_device.type == "cuda" else torch.float32
        return DTYPES[self.dtype]

    def graph_backend(self, path: str) -> str:
        """The resolved graph backend of a path ("decode" | "prefill" | "speculative_draft"):
        a name or "none". The draft model's runners default like decode."""
        value = getattr(self, f"{path}_cuda_graph")
        if value == "auto" and path == "speculative_draft":
            return self.graph_backend("decode")
        if value == "auto":
            if self.torch_device.type != "cuda":
                return "none"
            return "full" if path == "decode" else "breakable"
        return value

    def replace(self, **changes) -> EngineConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}


# vLLM's and SGLang's names for settings of ours, accepted by LLM(...) and the CLI so their
# users' commands work here: each maps to one field whose meaning is exactly its own, or for
# the eager switches, to every graph path off (a graph path also set to a backend is a
# conflict, refused).
ALIASES = {
    "gpu_memory_utilization": "mem_fraction",  # vLLM
    "mem_fraction_static": "mem_fraction",  # SGLang
    "tp_size": "tensor_parallel_size",  # SGLang
    "context_length": "max_model_len",  # SGLang
    "max_running_requests": "max_num_seqs",  # SGLang
    "block_size": "page_size",  # vLLM
    "disable_radix_cache": "disable_prefix_caching",  # SGLang
    "max_num_batched_tokens": "chunked_prefill_size",  # vLLM
    "random_seed": "seed",  # SGLang
    "prompt_lookup_min": "speculative_ngram_min_match_window_size",  # vLLM
    "prompt_lookup_max": "speculative_ngram_max_match_window_size",  # vLLM
}
# vLLM's switches that say the opposite of ours (its enable_prefix_caching is on by default,
# as our disable_prefix_caching is off)
NEGATED_ALIASES = {"enable_prefix_caching": "disable_prefix_caching"}
EAGER_SWITCHES = ("enforce_eager", "disable_cuda_graph")
ENGINE_ARG_ALIASES = (*ALIASES, *NEGATED_ALIASES, *EAGER_SWITCHES)


def resolve_aliases(args: dict[str, Any]) -> dict[str, Any]:
    """``args`` with vLLM's / SGLang's names replaced by ours (``ALIASES``, ``NEGATED_ALIASES``
    inverted, the eager switches as every graph path "none"); a ValueError where an alias and
    our name disagree."""
    out = {k: v for k, v in args.items() if k not in ENGINE_ARG_ALIASES}
    for alias, name, value, says in [
        *((a, n, args.get(a), "is") for a, n in ALIASES.items()),
        *((a, n, not args.get(a), "is the opposite of") for a, n in NEGATED_ALIASES.items()),
    ]:
        if alias in args:
            if name in out and out[name] != value:
                raise ValueError(
                    f"{alias} ({args[alias]}) and {name} ({out[name]}) disagree: give one "
                    f"({alias} {says} {name} under vLLM's or SGLang's name)"
                )
            out[name] = value
    switch = next((k for k in EAGER_SWITCHES if args.get(k)), None)
    if switch is not None:
        for path in GRAPH_PATHS:
            if out.get(path, "auto") not in ("auto", "none"):
                raise ValueError(
                    f"{switch} turns every CUDA graph off, but {path} is {out[path]!r}: "
                    "drop one of them"
                )
            out[path] = "none"
    return out


def parse_graph_memory(text: str) -> tuple[str, float]:
    """``("fraction", f)`` for "0.05" (0 < f < 1), ``("bytes", n)`` for "2GiB", "500MB", "2e9"."""
    value = str(text).strip().lower().replace("_", "")
    number = value.rstrip("kmgib")
    unit = value[len(number) :]
    try:
        amount = float(number)
    except ValueError:
        amount = -1.0
    if unit not in _BYTE_UNITS or amount <= 0:
        raise ValueError(
            f"cuda_graph_memory must be a byte count (e.g. 2GiB, 500MB, 2e9) or a fraction of "
            f"free memory between 0 and 1 (e.g. 0.05), got {text!r}"
        )
    if not unit and amount < 1:
        return "fraction", amount
    return "bytes", amount * _BYTE_UNITS[unit]
