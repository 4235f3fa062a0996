"""Log-probabilities, penalties, logit bias, allowed_token_ids, bad_words and min_tokens on CUDA
(float32, so graphs and eager must agree to rounding): with decode and prefill graphs captured
at start-up and under the overlap schedule, against an eager engine and a float64
transformers forward over the same tokens, in a mixed batch with penalised (greedy and
seeded) and plain requests; prompt scores from captured prefill graphs."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def graphs_and_eager(path, prompts, params):
    """The outputs of an engine with graphs captured at start-up, of an eager one, and the
    first's forward counts (float32: they must agree to rounding)."""
    from nanograph import LLM

    common = dict(dtype="float32", progress=False, max_num_seqs=8, chunked_prefill_size=256)
    graphs = LLM(path, cuda_graph_capture="startup", cuda_graph_max_bs=8, **common)
    got = graphs.generate(prompts, params)
    replays = graphs.engine.runner.forward_counts()
    graphs.close()
    eager = LLM(path, decode_cuda_graph="none", prefill_cuda_graph="none", **common)
    want = eager.generate(prompts, params)
    eager.close()
    return got, want, replays


def test_graph_logprobs_and_penalties_equal_eager_and_float64(small_qwen3):
    import transformers

    from nanograph import SamplingParams

    path = small_qwen3("logprobs", layers=2, hidden=256)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 4096, (n,), generator=g).tolist()
               for n in (5, 37, 130, 9, 21, 64, 12, 40)]  # fmt: skip
    params = [SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=k)
              for k in (4, 0, 20)]  # fmt: skip
    params.append(SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
    penalties = dict(presence_penalty=-0.5, frequency_penalty=0.3, repetition_penalty=1.2,
                     logit_bias={7: 2.0, 100: -3.0})  # fmt: skip
    params.append(SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, **penalties))
    params.append(SamplingParams(max_tokens=12, temperature=0.9, seed=4, ignore_eos=True,
                                 logprobs=2, **penalties))  # fmt: skip
    # min_tokens masks the stop token its bias forces (the token in flight counts)
    params.append(SamplingParams(max_tokens=12, temperature=0.0, logit_bias={7: 100.0},
                                 stop_token_ids=[7], min_tokens=5))  # fmt: skip
    params.append(SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True,
                                 allowed_token_ids=[5, 9, 300, 4000]))  # fmt: skip
    got, want, replays = graphs_and_eager(path, prompts, params)
    assert sum(c["graph"] for c in replays.values()) > 0, replays
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert got[3].logprobs is None and want[3].logprobs is None
    assert (len(got[6].token_ids), got[6].stop_reason) == (5, 7)
    assert set(got[7].token_ids) <= {5, 9, 300, 4000} and len(got[7].token_ids) == 12
    hf = transformers.AutoModelForCausalLM.from_pretrained(path).double().cuda().eval()
    for prompt, out, ref, p in zip(prompts, got, want, params):
        if p.logprobs is None:
            continue
        assert len(out.logprobs) == len(out.token_ids)
        with torch.no_grad():
            logits = hf(torch.tensor([prompt + out.token_ids], device="cuda")).logits[0]
        expected = torch.log_softmax(logits[len(prompt) - 1 : -1], -1).cpu()
        for i, (token, lp, lp_eager) in enumerate(zip(out.token_ids, out.logprobs, ref.logprobs)):
            assert lp.logprob == pytest.approx(lp_eager.logprob, abs=1e-4)
            assert lp.logprob == pytest.approx(expected[i, token].item(), abs=2e-3)
            assert len(lp.top) == p.logprobs
            values = [v for _, v in lp.top]
            assert values == pytest.approx([v for _, v in lp_eager.top], abs=1e-4)
            assert values == pytest.approx(expected[i].topk(p.logprobs).values.tolist(), abs=2e-3)


def test_graph_prompt_logprobs_equal_eager_and_float64(small_qwen3):
    """Prompt scores read from the hidden rows of captured prefill graphs (chunked, scored in
    capped chunks) equal eager's and a float64 transformers forward's."""
    import transformers

    from nanograph import SamplingParams

    path = small_qwen3("logprobs", layers=2, hidden=256)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 4096, (n,), generator=g).tolist() for n in (700, 33, 2)]
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True, prompt_logprobs=5)
    got, want, replays = graphs_and_eager(path, prompts, params)
    assert replays["prefill"]["graph"] > 0, replays
    hf = transformers.AutoModelForCausalLM.from_pretrained(path).double().cuda().eval()
    for prompt, out, ref in zip(prompts, got, want):
        assert out.token_ids == ref.token_ids and len(out.prompt_logprobs) == len(prompt)
        with torch.no_grad():
            logits = hf(torch.tensor([prompt], device="cuda")).logits[0]
        expected = torch.log_softmax(logits, -1).cpu()
        for i, (lp, lp_eager) in enumerate(zip(out.prompt_logprobs[1:], ref.prompt_logprobs[1:])):
            assert lp.logprob == pytest.approx(lp_eager.logprob, abs=1e-4)
            assert lp.logprob == pytest.approx(expected[i, prompt[i + 1]].item(), abs=2e-3)
            values = [v for _, v in lp.top]
            assert values == pytest.approx(expected[i].topk(5).values.tolist(), abs=2e-3)


def test_graph_bad_words_equal_eager(small_qwen3, tmp_path):
    """bad_words under captured graphs and the overlap schedule: pushed to "a" and "b" (a bias
    no random logit comes near), with "aa" and "bb" banned, greedy answers alternate the two;
    the previous token is the one in flight, compared on the device. Equal to eager."""
    import shutil

    from serving import byte_tokenizer

    from nanograph import SamplingParams

    path = tmp_path / "with-tokenizer"
    shutil.copytree(small_qwen3("bad-words", layers=2, hidden=256), path)
    tokenizer = byte_tokenizer()
    tokenizer.hf.save_pretrained(path)
    bias = {tokenizer.encode(c, add_special_tokens=False)[0]: 30.0 for c in "ab"}
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 4096, (n,), generator=g).tolist() for n in (5, 37, 130, 9)]
    greedy = dict(max_tokens=12, temperature=0.0, ignore_eos=True, logit_bias=bias)
    params = [SamplingParams(**greedy, bad_words=["aa", "bb"]) for _ in range(3)]
    params.append(SamplingParams(**greedy))  # without: not alternating
    got, want, replays = graphs_and_eager(str(path), prompts, params)
    assert sum(c["graph"] for c in replays.values()) > 0, replays
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    for out in got[:3]:
        assert len(out.text) == 12 and set(out.text) <= set("ab"), out.text
        assert "aa" not in out.text and "bb" not in out.text
    assert "aa" in got[3].text or "bb" in got[3].text


def test_graph_structured_outputs_equal_eager(small_qwen3, tmp_path):
    """Structured outputs under captured graphs (each step's tokens read while the next
    forward runs, then its masks) beside plain requests: a regex, a choice, a grammar and a
    structural tag, greedy and sampled, equal to eager, each inside its form."""
    import json
    import re
    import shutil

    pytest.importorskip("xgrammar")
    from serving import byte_tokenizer

    from nanograph import SamplingParams

    path = tmp_path / "with-tokenizer"
    shutil.copytree(small_qwen3("structured", layers=2, hidden=256), path)
    byte_tokenizer().hf.save_pretrained(path)
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 4096, (n,), generator=g).tolist() for n in (5, 37, 130, 9, 300)]
    regex = "(ab|ba)[xy]{3}|c[0-9]{2}"
    forms = [dict(regex=regex), dict(choice=["yes", "no", "maybe so"]),
             dict(grammar='root ::= "n=" [0-9] [0-9] ";"')]  # fmt: skip
    params = [SamplingParams(max_tokens=12, temperature=0.0, structured_outputs=f) for f in forms]
    params.append(
        SamplingParams(max_tokens=12, temperature=0.9, seed=2, structured_outputs=forms[0])
    )
    params.append(SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
    # free text where each "<f>" opens a tag holding {"a": <integer>}; the bias makes the
    # model write the trigger at all
    answer = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    tag = {"type": "structural_tag", "format": {
        "type": "triggered_tags", "triggers": ["<f>"],
        "tags": [{"type": "tag", "begin": "<f>", "end": "</f>",
                  "content": {"type": "json_schema", "json_schema": answer}}]}}  # fmt: skip
    bias = {byte_tokenizer().encode(c, add_special_tokens=False)[0]: 8.0 for c in "<f>"}
    prompts.append(prompts[1])
    params.append(SamplingParams(max_tokens=160, temperature=1.0, seed=3, ignore_eos=True,
                                 logit_bias=bias,
                                 structured_outputs={"structural_tag": tag}))  # fmt: skip
    got, want, replays = graphs_and_eager(str(path), prompts, params)
    assert sum(c["graph"] for c in replays.values()) > 0, replays
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert re.fullmatch(regex, got[0].text) and re.fullmatch(regex, got[3].text)
    assert got[1].text in ("yes", "no", "maybe so")
    assert re.fullmatch("n=[0-9]{2};", got[2].text)
    assert len(got[4].token_ids) == 12
    tags = re.findall("<f>(.*?)</f>", got[5].text, re.S)
    assert tags, got[5].text
    assert all(list(json.loads(t)) == ["a"] for t in tags), got[5].text
