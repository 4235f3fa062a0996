"""SmolLM2-135M-Instruct (real Q4_1 GGUF weights) against transformers loading the same file."""

from __future__ import annotations

import pytest
import torch
from conftest import requires_smollm2, smollm2_gguf

from nanograph import LLM, SamplingParams
from nanograph.runners.forward_batch import ForwardBatch

pytestmark = requires_smollm2
PROMPT = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def llm():
    return LLM("smollm2-135m", progress=False)


@pytest.fixture(scope="module")
def hf_model():
    from transformers import AutoModelForCausalLM

    path = smollm2_gguf()
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, torch_dtype=torch.float32
    )
    return model.eval()


def test_logits_match_transformers(llm, hf_model):
    ids = llm.tokenizer.apply_chat_template(PROMPT)
    with torch.no_grad():
        ref = hf_model(torch.tensor([ids])).logits[0, -1]
    kv = llm.engine.kv_cache
    pages = kv.allocator.allocate(kv.pages_needed(len(ids)))
    batch = ForwardBatch.build([ids], [0], [pages], kv.page_size, [True])
    ours = llm.engine.runner.forward(batch)[0]
    kv.allocator.free(pages)
    torch.testing.assert_close(ours, ref, atol=2e-4, rtol=1e-4)


def test_greedy_32_tokens_match_transformers(llm, hf_model):
    ids = llm.tokenizer.apply_chat_template(PROMPT)
    ours = llm.generate([ids], SamplingParams(max_tokens=32, temperature=0, ignore_eos=True))[0]
    with torch.no_grad():
        ref = hf_model.generate(
            torch.tensor([ids]), max_new_tokens=32, do_sample=False,
            output_logits=True, return_dict_in_generate=True,
            eos_token_id=None, pad_token_id=0,
        )  # fmt: skip
    ref_tokens = ref.sequences[0, len(ids) :].tolist()
    for i, (a, b) in enumerate(zip(ours.token_ids, ref_tokens)):
        if a != b:
            # a tie: the two top logits of the reference at the first difference are ~equal
            top2 = ref.logits[i][0].topk(2).values
            assert (top2[0] - top2[1]).abs() < 1e-4, (i, a, b, top2)
            break
    else:
        assert ours.token_ids == ref_tokens


def test_chat_answer_is_sensible(llm):
    out = llm.chat(PROMPT, SamplingParams(max_tokens=24, temperature=0))[0]
    assert "Paris" in out.text
    assert out.finish_reason in ("stop", "length")


def test_chat_template_kwargs_are_the_templates_variables():
    """vLLM's chat_template_kwargs reach the template (Qwen3's enable_thinking, here in a
    template of our own); apply_chat_template's own arguments are refused."""
    llm = LLM("smollm2-135m", max_model_len=64, progress=False)
    llm.tokenizer.hf.chat_template = (
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
        "{% if enable_thinking is defined and not enable_thinking %} /no_think{% endif %}"
    )
    params = SamplingParams(max_tokens=2, temperature=0)
    plain = llm.chat(PROMPT, params)[0].prompt_token_ids
    quiet = llm.chat(PROMPT, params, chat_template_kwargs={"enable_thinking": False})[0]
    assert plain == llm.tokenizer.encode(PROMPT[0]["content"], False)
    assert quiet.prompt_token_ids == llm.tokenizer.encode(PROMPT[0]["content"] + " /no_think",
                                                          False)  # fmt: skip
    taken = llm.chat(PROMPT, params, chat_template_kwargs={"tokenize": True})[0]
    assert not taken.ok and "chat_template_kwargs cannot set 'tokenize'" in taken.error
    with pytest.raises(ValueError, match="chat_template_kwargs must be a dict"):
        llm.chat(PROMPT, params, chat_template_kwargs=["enable_thinking"])
    assert not llm.engine.has_work()


def test_stop_string_cuts_the_text(llm):
    full = llm.chat(PROMPT, SamplingParams(max_tokens=24, temperature=0))[0]
    assert "Paris" in full.text and full.stop_reason is None  # EOS or the length
    cut = llm.chat(PROMPT, SamplingParams(max_tokens=24, temperature=0, stop=["Paris"]))[0]
    assert cut.finish_reason == "stop" and cut.stop_reason == "Paris"
    assert cut.text == full.text[: full.text.index("Paris")]
    kept = SamplingParams(max_tokens=24, temperature=0, stop=["Paris"],
                          include_stop_str_in_output=True)  # fmt: skip
    assert llm.chat(PROMPT, kept)[0].text == full.text[: full.text.index("Paris") + 5]
    # two stop strings met by one token: the text is cut at the earlier, which stop_reason names
    assert "of France" in full.text
    both = SamplingParams(max_tokens=24, temperature=0, stop=["France", "of France"])
    cut = llm.chat(PROMPT, both)[0]
    assert (cut.text, cut.stop_reason) == (full.text[: full.text.index("of France")], "of France")


def test_min_tokens_goes_past_eos_and_holds_off_stop_strings(llm):
    """vLLM's min_tokens: the greedy answer ends with EOS after n tokens; with min_tokens n + 3
    it goes on past it (the first n tokens the same), and a stop string met before min_tokens
    does not cut the text."""
    full = llm.chat(PROMPT, SamplingParams(max_tokens=24, temperature=0))[0]
    n = len(full.token_ids)
    assert full.finish_reason == "stop" and n < 20  # ended by EOS
    longer = llm.chat(PROMPT, SamplingParams(max_tokens=24, temperature=0, min_tokens=n + 3))[0]
    assert longer.token_ids[:n] == full.token_ids and len(longer.token_ids) >= n + 3
    assert longer.text.startswith(full.text)
    # "of" comes early in the answer: held off past it, the text is cut at a later "of" or not
    late = SamplingParams(max_tokens=24, temperature=0, min_tokens=n + 3, stop=["of"])
    held = llm.chat(PROMPT, late)[0]
    assert held.text.startswith(full.text) and held.token_ids[:n] == full.token_ids


def test_bad_words_keep_a_word_out_of_the_answer(llm):
    """vLLM's bad_words on a real tokenizer: the answer names Paris; with "Paris" banned (its
    tokens as written and after a space) it says the same up to there, then something else."""
    greedy = SamplingParams(max_tokens=24, temperature=0)
    full = llm.chat(PROMPT, greedy)[0].text
    assert "Paris" in full
    head = full[: full.index("Paris")]
    banned = llm.chat(PROMPT, SamplingParams(max_tokens=24, temperature=0, bad_words=["Paris"]))
    assert banned[0].text.startswith(head) and "Paris" not in banned[0].text


def test_seeded_sampling_is_reproducible(llm):
    params = SamplingParams(max_tokens=16, temperature=0.9, top_p=0.95, top_k=50, seed=11)
    first, second = (llm.chat(PROMPT, params)[0].text for _ in range(2))
    assert first == second and first
