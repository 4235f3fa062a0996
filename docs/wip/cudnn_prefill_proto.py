"""Prototype (stop 47, issue 18): cuDNN's attention for a prefill's new keys, in a CUDA graph.

`bench attention` (h200/stop38_6fcef6d/call5) has SDPA's cuDNN backend ahead of our extend kernel
on every prefill shape: 1 x 8192 with qwen3-0.6b heads 0.513 against 0.604 ms a layer (28
layers: ~2.5 ms of the 8k prefill's 32.2, the issue's 30 ms aim), qwen3-8b heads 0.974 against
1.180, 32 x 256 0.069 against 0.134. It ran dense [B, H, L, D] inputs, one length per batch. The
engine's prefill is a flat batch of requests of any lengths (sentinel slots of length 0, rows
padded past the last request), some with a cached prefix, in a graph captured per token count.
What a cuDNN path needs, asked in one call (~2 min; prints a verdict):

1. varlen: ``aten._cudnn_attention_forward`` with ``cum_seq_q/k`` (cuDNN's ragged layout; torch's
   nested-tensor path) and GQA: does it run and match a float32 reference per request, with
   zero-length requests and padded rows?
2. its log-sum-exp: layout and base, which continuing from cuDNN's result over a cached prefix
   needs (``continue_over_prefix`` below: the online softmax started at m = lse, l = 1, acc =
   out; on the CPU it is checked against float64, on the device with cuDNN's own out and lse);
3. q/k/v as the engine has them (views of the q/k/v product's rows): accepted and right, or
   must they be packed first (torch computes the ragged offsets as ``cum_seq * heads * dim``,
   i.e. packed rows; the copy is timed as its own arm)?
4. capture: one graph, replayed after the lengths in the static ``cum_seq`` buffer changed
   (same request slots, same max length): right?
5. time in a CUDA graph against the engine's kernel on the same work (``paged_attention`` with
   ``new_kv``, as the prefill runs it), the max length given as the graph's token count and as
   the batch's longest request; and SDPA's dense cuDNN call where the batch is uniform.

    python3 docs/wip/cudnn_prefill_proto.py --out OUT.json                  # GPU
    TRITON_INTERPRET=1 python3 docs/wip/cudnn_prefill_proto.py --dry        # CPU: the script

``--dry`` stands a float32 torch implementation in for cuDNN (same signature, same outputs as
the probes expect), runs the probes and the Triton arm at tiny sizes and skips the timing.

Decision rule: worth an engine path iff probes 1, 2 and 4 pass and, at 1 x 8192 and on the
ragged batch with qwen3-0.6b heads, cuDNN plus the copies it needs (q/k/v packed if probe 3
fails; its output into the attend op's buffer, always: cuDNN allocates its own) takes under
0.9x the engine kernel's time. Then the path is: cuDNN over every request's new keys, then the
Triton kernel over cached prefixes only, started from cuDNN's (out, lse) (requests without a
prefix exit at once).
"""

from __future__ import annotations

import argparse
import json
import math
import traceback

import torch
import torch.nn.functional as F

LAYOUTS = {"0.6b": (16, 8, 128), "8b": (32, 8, 128)}  # q heads, kv heads, head dim
LOG2E = 1.4426950408889634


def cudnn_varlen(q, k, v, cum, max_len, scale):
    """(out [T, Hq, D], lse as cuDNN returns it) over each request's own keys, causal."""
    res = torch.ops.aten._cudnn_attention_forward(
        q, k, v, None, cum, cum, max_len, max_len, True, 0.0, True, False, scale=scale
    )
    return res[0], res[1]


def math_varlen(q, k, v, cum, max_len, scale):
    """``cudnn_varlen``'s stand-in for --dry: lse as [T, Hq, 1] (torch's nested layout)."""
    out, lse = reference(q, k, v, cum.tolist(), scale)
    return out.to(q.dtype), lse[..., None]


def reference(q, k, v, cum, scale, prefix=None):
    """float32 (float64 for float64 inputs) per-request causal attention: out [T, Hq, D] and the
    natural-log lse [T, Hq]; rows past cum[-1] stay zero. ``prefix``: (k, v) [P, Hkv, D] cached
    before request 0's new tokens (one request then), seen by every one of its rows."""
    acc_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    group = q.shape[1] // k.shape[1]
    out = torch.zeros(q.shape, dtype=acc_dtype, device=q.device)
    lse = torch.full(q.shape[:2], float("-inf"), dtype=acc_dtype, device=q.device)
    for a, b in zip(cum[:-1], cum[1:], strict=True):
        if b == a:
            continue
        kk, vv = k[a:b], v[a:b]
        past = 0
        if prefix is not None:
            past = prefix[0].shape[0]
            kk, vv = torch.cat([prefix[0], kk]), torch.cat([prefix[1], vv])
        kk = kk.to(acc_dtype).repeat_interleave(group, 1)
        vv = vv.to(acc_dtype).repeat_interleave(group, 1)
        for c in range(a, b, 512):  # query chunks: [Hq, 512, keys] at a time
            e = min(c + 512, b)
            s = torch.einsum("qhd,khd->hqk", q[c:e].to(acc_dtype), kk) * scale
            rows = torch.arange(c - a, e - a, device=q.device)[:, None] + past
            s = s.masked_fill(torch.arange(kk.shape[0], device=q.device)[None] > rows, -math.inf)
            lse[c:e] = torch.logsumexp(s, -1).T
            out[c:e] = torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), vv)
    return out, lse


def continue_over_prefix(out_new, lse_new, q, k_prefix, v_prefix, scale):
    """The online softmax over cached keys every new row sees, started from the new keys'
    normalised result: m = lse (log2 units), l = 1, acc = out. What the Triton kernel would
    run for requests with a prefix after cuDNN took their new keys."""
    group = q.shape[1] // k_prefix.shape[1]
    kp = k_prefix.float().repeat_interleave(group, 1)
    vp = v_prefix.float().repeat_interleave(group, 1)
    s = torch.einsum("qhd,khd->qhk", q.float(), kp) * scale * LOG2E
    m0 = lse_new.float() * LOG2E  # [T, Hq]
    m = torch.maximum(m0, s.amax(-1))
    p = torch.exp2(s - m[..., None])
    alpha = torch.exp2(m0 - m)
    acc = out_new.float() * alpha[..., None] + torch.einsum("qhk,khd->qhd", p, vp)
    return acc / (alpha + p.sum(-1))[..., None]


def _lse_rows(lse, t, hq):
    """cuDNN's lse as [T, Hq] whichever of the layouts it came in."""
    if lse.shape == (t, hq, 1) or lse.shape == (t, hq):
        return lse.reshape(t, hq)
    if lse.shape == (hq, t):
        return lse.T
    raise ValueError(f"lse of shape {tuple(lse.shape)}")


def _batch(lengths, layout, dev, dtype, pad_to=None, sentinels=0, seed=0):
    hq, hkv, d = LAYOUTS[layout]
    t_real = sum(lengths)
    t = pad_to or t_real
    g = torch.Generator(device=dev).manual_seed(seed)
    qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=g, device=dev).to(dtype)
    q = qkv[:, : hq * d].view(t, hq, d)
    k = qkv[:, hq * d : (hq + hkv) * d].view(t, hkv, d)
    v = qkv[:, (hq + hkv) * d :].view(t, hkv, d)
    cum = [0]
    for n in lengths:
        cum.append(cum[-1] + n)
    cum += [t_real] * sentinels
    return qkv, q, k, v, cum


def _err(out, ref, cum):
    """max |out - ref| over the requests' rows."""
    rows = slice(0, cum[-1])
    return float((out[rows].float() - ref[rows].float()).abs().max())


def probes(dev, dtype, varlen, scale_layout="0.6b", small=False):
    """1-4 of the module docstring; each {ok, ...} or {error}."""
    hq, hkv, d = LAYOUTS[scale_layout]
    scale = d**-0.5
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    lengths = [37, 1, 0, 19, 7] if small else [3000, 1, 517, 0, 2674, 999]
    pad = 72 if small else 8192
    results = {}

    def probe(name, fn):
        try:
            results[name] = fn()
        except Exception as e:  # noqa: BLE001 - every probe reports; the next still runs
            results[name] = {"error": f"{type(e).__name__}: {e}"[:400],
                             "trace": traceback.format_exc(limit=-2)[-600:]}  # fmt: skip
        print(name, json.dumps(results[name])[:300], flush=True)

    qkv, q, k, v, cum = _batch(lengths, scale_layout, dev, dtype, pad_to=pad, sentinels=2)
    qp, kp, vp = q.contiguous(), k.contiguous(), v.contiguous()
    cum_t = torch.tensor(cum, dtype=torch.int32, device=dev)
    ref, ref_lse = reference(qp, kp, vp, cum, scale)
    max_len = max(lengths)

    def varlen_packed():
        out, lse = varlen(qp, kp, vp, cum_t, max_len, scale)
        torch.cuda.synchronize() if dev.type == "cuda" else None
        err = _err(out, ref, cum)
        return {"ok": err < tol, "max_err": err, "out_shape": list(out.shape),
                "lse_shape": list(lse.shape), "lse_dtype": str(lse.dtype)}  # fmt: skip

    def lse_layout():
        _, lse = varlen(qp, kp, vp, cum_t, max_len, scale)
        rows = _lse_rows(lse, q.shape[0], hq)[: cum[-1]].float()
        want = ref_lse[: cum[-1]]
        errs = {"natural": float((rows - want).abs().max()),
                "log2": float((rows - want * LOG2E).abs().max())}  # fmt: skip
        base = min(errs, key=errs.get)
        return {"ok": errs[base] < 1e-2, "base": base, **errs}

    def max_len_as_tokens():
        out, _ = varlen(qp, kp, vp, cum_t, q.shape[0], scale)
        err = _err(out, ref, cum)
        return {"ok": err < tol, "max_err": err}

    def strided_views():
        out, _ = varlen(q, k, v, cum_t, max_len, scale)
        err = _err(out, ref, cum)
        return {"ok": err < tol, "max_err": err, "q_stride": list(q.stride())}

    def continuation():
        # request 0 gets a cached prefix: cuDNN (or the stand-in) over its new keys, then the
        # prefix pass from its (out, lse), against attention over prefix + new keys at once
        p_len = 23 if small else 1500
        g = torch.Generator(device=dev).manual_seed(1)
        k_pre = torch.randn(p_len, hkv, d, generator=g, device=dev).to(dtype)
        v_pre = torch.randn(p_len, hkv, d, generator=g, device=dev).to(dtype)
        n0 = lengths[0]
        one = torch.tensor([0, n0], dtype=torch.int32, device=dev)
        out, lse = varlen(qp[:n0].contiguous(), kp[:n0].contiguous(), vp[:n0].contiguous(), one,
                          n0, scale)  # fmt: skip
        lse = _lse_rows(lse, n0, hq)
        if lse_base_log2[0]:
            lse = lse / LOG2E
        got = continue_over_prefix(out, lse, qp[:n0], k_pre, v_pre, scale)
        want, _ = reference(qp[:n0], kp[:n0], vp[:n0], [0, n0], scale, prefix=(k_pre, v_pre))
        err = float((got - want).abs().max())
        return {"ok": err < tol, "max_err": err}

    def capture():
        if dev.type != "cuda":
            return {"skipped": "CPU"}
        sq, sk, sv = qp.clone(), kp.clone(), vp.clone()
        scum = cum_t.clone()
        varlen(sq, sk, sv, scum, q.shape[0], scale)  # build cuDNN's plan outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out, _ = varlen(sq, sk, sv, scum, q.shape[0], scale)
        other = [100, 5000, 92, 0, 0, 1]  # same slots (6 + 2 sentinels), other lengths
        _, q2, k2, v2, cum2 = _batch(other, scale_layout, dev, dtype, pad_to=pad, sentinels=2,
                                     seed=7)  # fmt: skip
        sq.copy_(q2), sk.copy_(k2), sv.copy_(v2)
        scum.copy_(torch.tensor(cum2, dtype=torch.int32, device=dev))
        graph.replay()
        torch.cuda.synchronize()
        want, _ = reference(q2.contiguous(), k2.contiguous(), v2.contiguous(), cum2, scale)
        err = _err(out, want, cum2)
        return {"ok": err < tol, "max_err": err}

    lse_base_log2 = [False]
    probe("varlen_packed", varlen_packed)
    probe("lse_layout", lse_layout)
    lse_base_log2[0] = results["lse_layout"].get("base") == "log2"
    probe("max_len_as_tokens", max_len_as_tokens)
    probe("strided_views", strided_views)
    probe("continuation", continuation)
    probe("capture", capture)
    return results


def _triton_arm(q, k, v, cum, dev, dtype):
    """The engine's prefill attention on the same rows: the cache holds every new key (as
    rope_store_kv leaves it), the kernel reads the new keys from the rows (TMA)."""
    from nanograph.kernels.attention import paged_attention

    t, hkv, d = k.shape
    page = 16
    starts = torch.tensor(cum, dtype=torch.int32, device=dev)
    lens = starts[1:] - starts[:-1]
    # each request its own pages, holding its new keys as rope_store_kv leaves them
    width = (max(int(lens.max()), 1) + page - 1) // page
    table = torch.zeros(len(cum) - 1, width, dtype=torch.int32, device=dev)
    k_c = torch.zeros((len(cum) - 1) * width * page, hkv, d, dtype=dtype, device=dev)
    v_c = torch.zeros_like(k_c)
    for r, (a, b) in enumerate(zip(cum[:-1], cum[1:], strict=True)):
        table[r] = torch.arange(r * width, (r + 1) * width, dtype=torch.int32, device=dev)
        k_c[r * width * page : r * width * page + b - a] = k[a:b]
        v_c[r * width * page : r * width * page + b - a] = v[a:b]
    out = torch.empty(q.shape, dtype=dtype, device=dev)
    scale = d**-0.5

    def run():
        return paged_attention(q, k_c, v_c, table, lens, lens, starts, page, scale, out=out,
                               new_kv=(k, v))  # fmt: skip

    return run


def _arms(lengths, pad, q, k, v, cum, dev, dtype, varlen=cudnn_varlen):
    """name -> a call doing one arm's work on the batch (q/k/v: views of the q/k/v rows)."""
    t, hq, d = q.shape
    hkv = k.shape[1]
    scale = d**-0.5
    qp, kp, vp = q.contiguous(), k.contiguous(), v.contiguous()
    cum_t = torch.tensor(cum, dtype=torch.int32, device=dev)
    out_buffer = torch.empty_like(qp)
    arms = {
        "triton": _triton_arm(qp, kp, vp, cum, dev, dtype),
        "cudnn_varlen_max_tokens": lambda: varlen(qp, kp, vp, cum_t, t, scale),
        "cudnn_varlen_max_longest": lambda: varlen(qp, kp, vp, cum_t, max(lengths), scale),
        "pack_copy": lambda: (qp.copy_(q), kp.copy_(k), vp.copy_(v)),
        # cuDNN allocates its output: the attend op must still fill the caller's buffer
        "out_copy": lambda: out_buffer.copy_(qp),
    }
    if len(set(lengths)) == 1 and pad is None:  # uniform: SDPA's dense call, as bench attention
        from torch.nn.attention import SDPBackend, sdpa_kernel

        b, n = len(lengths), lengths[0]
        bhsd = [x.view(b, n, -1, d).transpose(1, 2).contiguous() for x in (qp, kp, vp)]
        bshd_views = [x.view(b, n, -1, d).transpose(1, 2) for x in (q, k, v)]

        def dense(qq, kk, vv):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(qq, kk, vv, is_causal=True,
                                                      enable_gqa=True)  # fmt: skip

        arms["sdpa_cudnn_dense"] = lambda: dense(*bhsd)
        arms["sdpa_cudnn_bshd_views"] = lambda: dense(*bshd_views)
    assert hq % hkv == 0
    return arms


def measure(out_path, dry):
    dev = torch.device("cpu" if dry else "cuda")
    dtype = torch.float32 if dry else torch.bfloat16
    varlen = math_varlen if dry else cudnn_varlen
    report = {"device": "cpu (dry run)" if dry else torch.cuda.get_device_name(),
              "torch": torch.__version__, "probes": {}, "cases": []}  # fmt: skip
    if not dry:
        report["cudnn"] = torch.backends.cudnn.version()
    for layout in ("0.6b", "8b"):
        report["probes"][layout] = probes(dev, dtype, varlen, layout, small=dry)
        if dry:  # the Triton arm under the interpreter, against the reference
            _, q, k, v, cum = _batch([37, 1, 19], layout, dev, dtype, pad_to=64, sentinels=1)
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
            got = _triton_arm(q, k, v, cum, dev, dtype)()
            want, _ = reference(q, k, v, cum, LAYOUTS[layout][2] ** -0.5)
            print("triton arm", layout, "max err", _err(got, want, cum), flush=True)
            for lengths, pad in (([8, 8], None), ([37, 1, 19], 64)):  # every arm runs once
                _, q, k, v, cum = _batch(lengths, layout, dev, dtype, pad_to=pad, sentinels=1)
                for arm, fn in _arms(lengths, pad, q, k, v, cum, dev, dtype, varlen).items():
                    try:
                        fn()
                        print("  arm", arm, "ran", flush=True)
                    except Exception as e:  # noqa: BLE001 - SDPA's cuDNN is CUDA-only
                        print("  arm", arm, "failed:", str(e).splitlines()[0][:100])
    if dry:
        print(json.dumps(report)[:2000])
        return
    from nanograph.bench.common import graphed_samples, median

    cases = [("1x8192", [8192], None), ("1x2048", [2048], None), ("4x2048", [2048] * 4, None),
             ("32x256", [256] * 32, None),
             ("ragged_8192", [3000, 1, 517, 2674, 999, 700], 8192)]  # fmt: skip
    for layout in ("0.6b", "8b"):
        hq, _, d = LAYOUTS[layout]
        for name, lengths, pad in cases:
            _, q, k, v, cum = _batch(lengths, layout, dev, dtype, pad_to=pad, sentinels=2)
            t = q.shape[0]
            flops = sum(4.0 * n * (n + 1) / 2 * hq * d for n in lengths)
            row = {"layout": layout, "case": name, "lengths": lengths, "tokens": t}
            arms = _arms(lengths, pad, q, k, v, cum, dev, dtype)
            for arm, fn in arms.items():
                try:
                    samples = graphed_samples(fn, 100)
                    ms = median(samples)
                    row[arm] = {"ms": ms, "tflops": flops / ms / 1e9}
                except Exception as e:  # noqa: BLE001 - an arm that cannot run says why
                    row[arm] = {"error": f"{type(e).__name__}: {e}"[:300]}
                torch.cuda.empty_cache()
            report["cases"].append(row)
            print(layout, name, {a: round(r["ms"], 4) if "ms" in r else r for a, r in row.items()
                                 if isinstance(r, dict)}, flush=True)  # fmt: skip
    with open(out_path, "w") as f:
        json.dump(report, f, indent=1)
    verdict(report)


def verdict(report):
    p = report["probes"]["0.6b"]
    needed = all(p.get(n, {}).get("ok") for n in ("varlen_packed", "lse_layout", "capture"))
    print(
        "probes 1, 2, 4 (0.6b):",
        "pass" if needed else "FAIL",
        "| strided views:",
        "ok" if p.get("strided_views", {}).get("ok") else "need packing",
    )
    for row in report["cases"]:
        if row["layout"] != "0.6b" or "ms" not in row.get("triton", {}):
            continue
        best = min((row[a]["ms"] for a in row if a.startswith("cudnn_varlen") and "ms" in row[a]),
                   default=None)  # fmt: skip
        if best is None:
            continue
        pack = 0.0 if p.get("strided_views", {}).get("ok") else row["pack_copy"].get("ms", 0.0)
        copy = row["out_copy"].get("ms", 0.0)
        ratio = (best + pack + copy) / row["triton"]["ms"]
        print(
            f"  {row['case']}: (cuDNN{' + pack' if pack else ''} + out copy) / triton ="
            f" {ratio:.3f} ({'pays' if ratio < 0.9 else 'does not pay'}; cuDNN alone"
            f" {best / row['triton']['ms']:.3f})"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="JSON path (GPU run)")
    parser.add_argument("--dry", action="store_true", help="CPU: the stand-in, tiny sizes")
    args = parser.parse_args()
    measure(args.out, args.dry)
