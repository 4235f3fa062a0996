"""Command line: ``nanograph generate``, ``nanograph serve`` and ``nanograph bench ...``.

Engine flags are generated from ``EngineConfig`` so the CLI and the Python API cannot drift.
Answers go to stdout; the summary and logs go to stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import time
from pathlib import Path

from nanograph import __version__
from nanograph.loader.presets import PRESETS, unknown_model
from nanograph.serve.reasoning import REASONING_PARSERS
from nanograph.serve.tool_calls import TOOL_CALL_PARSERS

ENGINE_HELP = {
    "model": f"preset name ({', '.join(PRESETS)}), a .gguf file or a Hugging Face folder",
    "load_format": "auto | gguf | hf | dummy (random weights at full size, for benchmarks)",
    "dtype": "auto (bfloat16 on CUDA, float32 on CPU) | float32 | bfloat16 | float16",
    "device": "auto | cpu | cuda[:N]",
    "mem_fraction": "GPU: fraction of device memory for weights, graphs and the KV pool",
    "kv_cache_bytes": "CPU: byte budget of the KV pool",
    "page_size": "tokens per KV page",
    "max_total_tokens": "cap on the KV pool's tokens, any device (default: what memory allows)",
    "chunked_prefill_size": "token budget of one forward; longer prompts are split into chunks",
    "max_num_seqs": "most requests running at once",
    "max_model_len": "context length cap (default: the model's)",
    "attention_backend": "auto (triton on CUDA, torch_native on CPU) | triton | torch_native",
    "moe_backend": "experts of MoE models: auto (triton on CUDA, torch_native on CPU) | triton "
    "(fused, graph-safe) | torch_native (per-expert loop: an eager break; no full graphs)",
    "quantization": "mxfp4: keep gpt-oss' experts MXFP4 in memory (~4.25 bits a weight; the "
    "fused MoE kernels decode them; dummy weights too) | unset: the model's dtype (MXFP4 "
    "checkpoints dequantized as they load)",
    "chat_template": "a Jinja chat template, or a file holding one, in place of the model's "
    "own (for a model without one, or to change it)",
    "seed": "engine seed (sampling of requests without their own seed)",
    "decode_cuda_graph": "full | breakable | tc_piecewise | none | auto (full on CUDA, or "
    "breakable with a host-planned attention/MoE backend; none on CPU)",
    "prefill_cuda_graph": "full | breakable | tc_piecewise | none | auto (breakable on CUDA, "
    "none on CPU)",
    "debug_cuda_graph": "run captured paths as one eager break through the graph buffers and "
    "replay path (if a bug persists, it is in the model or runner)",
    "cuda_graph_max_bs": "largest decode batch captured",
    "cuda_graph_bs": "comma-separated decode batch sizes to capture (default: 1, 2, 4, 8, then "
    "steps of 8 up to --cuda-graph-max-bs)",
    "prefill_graph_tokens": "comma-separated prefill token buckets (default: ~40 up to "
    "--chunked-prefill-size)",
    "prefill_graph_slots": "request slots per prefill graph; more requests run eagerly",
    "cuda_graph_capture": "auto | startup (capture, then serve) | background (serve at once, "
    "capture on a thread, hottest shapes first) | lazy (capture a shape the 2nd time a batch "
    "needs it); auto = background on CUDA, startup with speculative decoding, tensor "
    "parallelism, a tc_piecewise path, no graph backend, or on CPU",
    "cuda_graph_memory": "graph memory budget of background/lazy capture: bytes (2GiB, 500MB) "
    "or a fraction of free memory (0.05); least recently replayed graphs are evicted to stay "
    "under it (default: estimated from the activation peak)",
    "cuda_graph_ladder": "default (the configured ladders) | auto (buckets learned from the "
    "batch sizes served, by a padding-cost model; background/lazy only); unset = auto under "
    "background capture, default otherwise",
    "disable_overlap_schedule": "read each step's tokens before scheduling the next "
    "(default: schedule and launch step t+1 while the device runs step t)",
    "disable_prefix_caching": "recompute every prompt from scratch (default: reuse the KV "
    "pages of cached prefixes; finished requests' pages stay cached until the pool needs them)",
    "speculative_algorithm": "speculative decoding: ngram (prompt lookup) | draft_model "
    "(off when unset)",
    "speculative_num_draft_tokens": "drafts proposed per request and step (k)",
    "speculative_ngram_min_match_window_size": "ngram: shortest suffix n-gram matched in the "
    "request's own tokens",
    "speculative_ngram_max_match_window_size": "ngram: longest suffix n-gram matched (the "
    "longest with an earlier occurrence wins)",
    "speculative_draft_model_path": "draft model for --speculative-algorithm draft_model (same "
    "tokenizer as the target: a preset, .gguf or Hugging Face folder)",
    "speculative_draft_cuda_graph": "graph backend of the draft model's runners: full | "
    "breakable | tc_piecewise | none | auto (as --decode-cuda-graph)",
    "tensor_parallel_size": "ranks the model is sharded over (GPU r for rank r; processes on "
    "CPU); this process is rank 0 and starts the others, or joins env:// (torchrun) when RANK "
    "is set",
    "distributed_timeout_s": "tensor parallelism: longest wait for another rank (start-up, each "
    "collective) before every rank fails with the failing rank named",
    "progress": None,  # not a flag: --quiet turns it off
}


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    from nanograph.engine.config import ALIASES, EAGER_SWITCHES, NEGATED_ALIASES, EngineConfig

    group = parser.add_argument_group("engine")
    for f in dataclasses.fields(EngineConfig):
        help_text = ENGINE_HELP.get(f.name)
        if help_text is None:
            continue
        # our flag, then vLLM's / SGLang's names for it
        flags = [_flag(f.name)] + [_flag(a) for a, name in ALIASES.items() if name == f.name]
        if f.type == "bool":
            group.add_argument(*flags, action="store_true", help=help_text)
            continue
        kind = {"int": int, "float": float, "int | None": int}.get(str(f.type), str)
        if f.type == "tuple[int, ...] | None":
            kind = int_list
        group.add_argument(*flags, dest=f.name, type=kind, default=f.default,
                           help=f"{help_text} [{f.default}]")  # fmt: skip
    for alias, name in NEGATED_ALIASES.items():
        group.add_argument(
            _flag(alias),
            action=argparse.BooleanOptionalAction,
            help=f"vLLM's switch; --no-{_flag(alias)[2:]} is {_flag(name)}",
        )
    group.add_argument(*map(_flag, EAGER_SWITCHES), dest="enforce_eager", action="store_true",
                       help="no CUDA graphs on any path (vLLM's and SGLang's flags for "
                       "none on every --*-cuda-graph)")  # fmt: skip
    group.add_argument("--quiet", action="store_true", help="no progress bars or summary")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def model_list(text: str) -> tuple[str, ...]:
    """argparse's ``type`` for comma-separated models, each a preset or an existing path: a
    typo in the last of several is refused before the first one runs for minutes."""
    models = tuple(m.strip() for m in text.split(",") if m.strip())
    for model in models:
        if model not in PRESETS and not Path(model).expanduser().exists():
            raise argparse.ArgumentTypeError(str(unknown_model(model)))
    return models


def int_list(text: str) -> tuple[int, ...]:
    """argparse's ``type`` for comma-separated integers ("1,8,32"; "" is none)."""
    try:
        return tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


def engine_config_from(args: argparse.Namespace):
    from nanograph.engine.config import NEGATED_ALIASES, EngineConfig, resolve_aliases

    values = {k: getattr(args, k) for k in EngineConfig.field_names() if hasattr(args, k)}
    for alias, name in NEGATED_ALIASES.items():
        if getattr(args, alias, None) is not None:  # given: it decides, unless ours was given too
            values[alias] = getattr(args, alias)
            if values.get(name) == getattr(EngineConfig, name):  # its default: not given
                del values[name]
    values["progress"] = not args.quiet
    values["enforce_eager"] = getattr(args, "enforce_eager", False)
    return EngineConfig(**resolve_aliases(values))


class _Ordered(argparse.Action):
    """Appends ``(kind, value)`` to ``args.inputs``, so a batch keeps the command line's order
    whatever the mix of --prompt, --messages and --prompt-ids."""

    def __call__(self, parser, namespace, values, option_string=None):
        inputs = getattr(namespace, "inputs", None) or []
        namespace.inputs = [*inputs, (self.dest, values)]


def _prompts(args: argparse.Namespace) -> list:
    prompts: list = []
    for kind, value in getattr(args, "inputs", None) or []:
        if kind == "prompt":
            prompts.append(value if args.no_chat_template else [{"role": "user", "content": value}])
        elif kind == "messages":
            prompts += _conversations(value)
        else:
            try:
                prompts.append([int(t) for t in value.split(",") if t.strip()])
            except ValueError:
                raise ValueError(
                    f"--prompt-ids takes comma-separated integers, got {value!r}"
                ) from None
    if not prompts:
        raise ValueError("nothing to generate: give --prompt, --messages or --prompt-ids")
    return prompts


def _conversations(source: str) -> list[list[dict]]:
    """--messages: JSON text or a file holding one conversation (a list of message objects)
    or a list of conversations."""
    text = source
    if not source.lstrip().startswith("["):
        try:
            with open(source) as f:
                text = f.read()
        except OSError as e:
            raise ValueError(f"--messages: cannot read {source!r} ({e.strerror})") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--messages is not valid JSON: {e}") from None
    shape = (
        '--messages takes a JSON list of messages ({"role": ..., "content": ...}) or a list '
        "of such lists"
    )
    if not isinstance(value, list) or not value:
        raise ValueError(f"{shape}; got {text[:60]!r}")
    if all(isinstance(m, dict) for m in value):
        return [value]
    if all(isinstance(c, list) and c and all(isinstance(m, dict) for m in c) for c in value):
        return value
    raise ValueError(f"{shape}; got {text[:60]!r}")


def cmd_generate(args: argparse.Namespace) -> int:
    from nanograph.engine.llm import LLM
    from nanograph.engine.sampling_params import SamplingParams

    params = SamplingParams(
        max_tokens=args.max_tokens,
        min_tokens=args.min_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        seed=args.sampling_seed,
        stop=tuple(args.stop or ()),
        ignore_eos=args.ignore_eos,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        repetition_penalty=args.repetition_penalty,
        n=args.n,
    )
    config = engine_config_from(args)
    prompts = _prompts(args)
    llm = LLM(**dataclasses.asdict(config))
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    completions = [(i, c) for i, out in enumerate(outputs) for c in out.outputs]
    many = len(completions) > 1
    for i, out in completions:
        if many:  # a block per completion, in order; a failed one's block holds its error
            print(f"--- [{i}{f'.{out.index}' if args.n > 1 else ''}] ---", flush=True)
            print(_answer(llm, out) if out.ok else f"(error: {out.error})", flush=True)
        elif out.ok:
            print(_answer(llm, out), flush=True)
        else:
            print(f"error: {out.error}", file=sys.stderr, flush=True)
    failed = sum(not c.ok for _, c in completions)
    if many and failed:
        what = "completions" if args.n > 1 else "prompts"
        print(f"error: {failed} of {len(completions)} {what} failed", file=sys.stderr, flush=True)
    if not args.quiet:
        _summary(llm, [c for _, c in completions], elapsed)
    return 1 if failed else 0


def _answer(llm, out) -> str:
    return out.text if llm.tokenizer is not None else str(out.token_ids)


def _summary(llm, outputs: list, elapsed: float) -> None:
    """``outputs``: every completion (``CompletionOutput``)."""
    e = llm.engine
    kv = e.kv_cache
    generated = sum(len(o.token_ids) for o in outputs)
    ttfts = [o.ttft_s for o in outputs if o.ttft_s is not None]
    rates = [o.decode_tokens_per_s for o in outputs if o.decode_tokens_per_s]
    lines = [
        (
            "model",
            f"{e.config.model} ({e.model_config.architecture}, "
            f"{e.model_config.num_params / 1e6:.0f}M params, {e.source.kind})",
        ),
        ("device / dtype", f"{e.device} / {str(e.dtype).removeprefix('torch.')}"),
        ("attention", e.attention.name),
        *([("moe", e.moe.name)] if e.moe is not None else []),
        *(
            [("tensor parallel", f"{e.tp.size} ranks; weights and KV pool below are rank 0's")]
            if e.tp.enabled
            else []
        ),  # fmt: skip
        ("weights", f"{e.weights_bytes / 2**20:.0f} MiB, loaded in {e.load_seconds:.1f} s"),
        (
            "KV pool",
            f"{kv.capacity_tokens} tokens in {kv.num_pages} pages of {kv.page_size}, "
            f"{kv.nbytes / 2**20:.0f} MiB",
        ),
        (
            "requests",
            f"{len(outputs)} ({sum(not o.ok for o in outputs)} failed), "
            f"{generated} tokens in {elapsed:.2f} s = {generated / max(elapsed, 1e-9):.1f} tok/s",
        ),
    ]
    if ttfts:
        lines.append(("TTFT", f"{1000 * sum(ttfts) / len(ttfts):.0f} ms mean"))
    if rates:
        lines.append(("decode", f"{sum(rates) / len(rates):.1f} tok/s per request (mean)"))
    if e.speculative is not None:
        s = e.speculative.stats
        lines.append((
            "speculative",
            f"{e.config.speculative_algorithm}, k={e.config.speculative_num_draft_tokens}: "
            f"{s.accepted_tokens}/{s.draft_tokens} drafts accepted, "
            f"{s.mean_accepted_length:.2f} tokens per verify",
        ))  # fmt: skip
    width = max(len(k) for k, _ in lines)
    print("", file=sys.stderr)
    for k, v in lines:
        print(f"{k:>{width}} : {v}", file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nanograph", description="A compact LLM inference engine built around CUDA graphs."
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true",
        help="debug logs: every captured graph shape with its capture seconds and pool bytes",
    )  # fmt: skip
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    parser.add_argument("--version", action="version", version=f"nanograph {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser(
        "generate",
        help="generate text for one or more prompts",
        description="Generate text. Sampling is greedy unless --temperature > 0.",
    )
    g = gen.add_argument_group("prompts (repeat any of them for a batch, answered in order)")
    g.add_argument("--prompt", action=_Ordered, help="a user message")
    g.add_argument(
        "--messages", action=_Ordered,
        help="a conversation as JSON (a list of {role, content} objects, or a list of such "
        "lists), or a path to a JSON file",
    )  # fmt: skip
    g.add_argument(
        "--prompt-ids", action=_Ordered,
        help="comma-separated token ids; for models without a tokenizer, e.g. dummy presets",
    )  # fmt: skip
    g.add_argument(
        "--no-chat-template",
        action="store_true",
        help="send --prompt as raw text instead of a chat user message",
    )
    s = gen.add_argument_group("sampling")
    s.add_argument("--max-tokens", type=int, default=128, help="tokens to generate at most [128]")
    s.add_argument("--min-tokens", type=int, default=0,
                   help="no end token or stop string before this many tokens [0]")  # fmt: skip
    s.add_argument("--temperature", type=float, default=0.0, help="0 = greedy [0.0]")
    s.add_argument("--top-k", type=int, default=-1, help="-1 = off [-1]")
    s.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass [1.0]")
    s.add_argument("--min-p", type=float, default=0.0, help="min-p filter [0.0]")
    s.add_argument("--sampling-seed", type=int, default=None, help="per-request seed")
    s.add_argument("--n", type=int, default=1, help="completions per prompt [1]")
    s.add_argument("--stop", action="append", help="stop string (repeatable)")
    s.add_argument("--ignore-eos", action="store_true", help="keep going past end-of-sequence")
    s.add_argument("--presence-penalty", type=float, default=0.0,
                   help="subtracted from generated tokens' logits, -2..2 [0.0]")  # fmt: skip
    s.add_argument("--frequency-penalty", type=float, default=0.0,
                   help="x times a token was generated, subtracted, -2..2 [0.0]")  # fmt: skip
    s.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="divides seen tokens' logits (prompt too), > 0; 1 = off [1.0]")  # fmt: skip
    add_engine_args(gen)
    gen.set_defaults(func=cmd_generate)
    _add_serve(sub)
    from nanograph.bench import BENCHES

    bench = sub.add_parser(
        "bench", help="benchmarks: " + ", ".join(BENCHES),
        description="Speed and memory benchmarks; each writes JSON (and a figure) to its --out "
        "path, by default under ./bench-out/ (git-ignored; committed results live in "
        "benchmarks/results/). Benches that need CUDA, and graph arms, are refused on a "
        "machine without it. `nanograph bench NAME --help` lists a benchmark's options.",
    )  # fmt: skip
    bench.add_argument("name", choices=sorted(BENCHES))
    bench.add_argument("args", nargs=argparse.REMAINDER, help="options of the benchmark")
    bench.set_defaults(func=lambda a: _bench(a.name, a.args))
    return parser


def _add_serve(sub) -> None:
    serve = sub.add_parser(
        "serve", help="an OpenAI-compatible HTTP server (chat and completions, streaming)",
        description="Serve the model over HTTP: /v1/chat/completions, /v1/completions, "
        "/v1/models, /health, /metrics. Needs the serve extra: pip install 'nanograph[serve]'.",
    )  # fmt: skip
    s = serve.add_argument_group("server")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on [127.0.0.1]")
    s.add_argument("--port", type=int, default=8000, help="port [8000]")
    s.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on /v1 endpoints")
    s.add_argument("--served-model-name", help="the model name clients send [--model]")
    s.add_argument(
        "--max-queue", type=int, default=1024,
        help="requests allowed to wait for admission; beyond it: 503 with Retry-After [1024]",
    )  # fmt: skip
    s.add_argument(
        "--shutdown-timeout", type=float, default=10.0,
        help="on SIGINT/SIGTERM, seconds in-flight requests get to finish before abort [10]",
    )  # fmt: skip
    s.add_argument(
        "--tool-call-parser", choices=TOOL_CALL_PARSERS,
        help="read tool calls out of chat answers in this format, so requests may offer the "
        "model tools (tool_choice auto): hermes is the <tool_call>{json}</tool_call> blocks "
        "of Qwen2.5, Qwen3 and Hermes models; qwen25 and qwen (SGLang's names) and qwen3 are "
        "other names for it. Unset: requests with tools get a 400 unless tool_choice is none",
    )  # fmt: skip
    s.add_argument(
        "--enable-auto-tool-choice", action="store_true",
        help="vLLM's switch, accepted for compatibility: --tool-call-parser alone turns tool "
        "calling on; this flag changes nothing but needs --tool-call-parser, as in vLLM",
    )  # fmt: skip
    s.add_argument(
        "--reasoning-parser", choices=REASONING_PARSERS,
        help="split chat answers' thinking (<think>...</think>) into message.reasoning and "
        "message.reasoning_content (vLLM's name and SGLang's; streamed: delta.reasoning and "
        "delta.reasoning_content), as vLLM and SGLang do: qwen3 for Qwen3 (a block "
        "the answer opens; none, as with enable_thinking false: all content), deepseek-r1 for "
        "templates that open <think> in the prompt (DeepSeek-R1, QwQ, Qwen3-Thinking-2507: "
        "reasoning until </think>). Unset: the thinking stays in the content",
    )  # fmt: skip
    s.add_argument(
        "--engine-process", action=argparse.BooleanOptionalAction, default=True,
        help="run the engine in its own process (default), so the HTTP handlers do not hold "
        "the GIL the engine needs between steps; --no-engine-process runs it in a thread of "
        "the server (qwen3-0.6b at saturation on an H200: 0.885x vs 0.74x of offline)",
    )  # fmt: skip
    add_engine_args(serve)
    serve.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    from nanograph.serve.server import run

    return run(args)


def _bench(name: str, argv: list[str]) -> int:
    from nanograph.bench import run

    return run(name, argv)


def main(argv: list[str] | None = None) -> int:
    """Runs a command. Errors are one line on stderr and a non-zero exit: 2 for what the user
    can fix (bad flags, values, files), 1 for anything else; ``--debug`` shows the traceback."""
    args = build_parser().parse_args(argv)
    level = logging.DEBUG if args.verbose else logging.INFO
    logging.basicConfig(
        level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if args.debug:
            raise
        user_error = isinstance(e, ValueError | OSError | MemoryError)
        kind = "error" if user_error else f"error ({type(e).__name__})"
        hint = "" if user_error else " (run with --debug for the traceback)"
        print(f"{kind}: {_one_line(e)}{hint}", file=sys.stderr)
        return 2 if user_error else 1


def _one_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return " ".join(text.split())
