"""The tokenizer from SmolLM2's GGUF metadata: round trips, streaming decode, and the chat
template against transformers' ``apply_chat_template``; the same tokenizer from an HF folder."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from conftest import requires_smollm2, smollm2_gguf

from nanograph.loader import ModelLoadError, Tokenizer

pytest.importorskip("transformers")
pytest.importorskip("gguf")

pytestmark = requires_smollm2

TEXTS = [
    "What is the capital of France?",
    "  leading spaces, tabs\tand\nnewlines  ",
    "héllo wörld — 你好, 🙂 emoji",
    "code: def f(x):\n    return x**2",
]
MESSAGES = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "Capital of Italy?"},
        {"role": "assistant", "content": "Rome."},
        {"role": "user", "content": "And of Spain? 🙂"},
    ],
]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_gguf(smollm2_gguf(), extra_eos_token_ids=[2])


def test_special_ids(tokenizer):
    assert tokenizer.eos_token_ids == (2,)  # <|im_end|>: ends an assistant turn
    assert tokenizer.bos_token_id == 1
    assert tokenizer.vocab_size == 49152
    assert tokenizer.has_chat_template


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids and all(isinstance(i, int) for i in ids)
    assert tokenizer.decode(ids) == text


def test_known_ids(tokenizer):
    assert tokenizer.encode("Hello world") == [19556, 905]  # SmolLM2 adds no BOS


def test_special_tokens_skipped_on_decode(tokenizer):
    ids = tokenizer.encode("Paris.<|im_end|>", add_special_tokens=False)
    assert ids[-1] == 2
    assert tokenizer.decode(ids) == "Paris."
    assert tokenizer.decode(ids, skip_special_tokens=False) == "Paris.<|im_end|>"


@pytest.mark.parametrize("text", TEXTS)
def test_stream_decode_equals_decode(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False) + [2]
    stream = tokenizer.decode_stream()
    pieces = [stream.step(i) for i in ids]
    assert "".join(pieces) == tokenizer.decode(ids)
    assert all("\ufffd" not in p for p in pieces)  # no half characters leak out


@pytest.mark.parametrize("messages", MESSAGES, ids=["default-system", "multi-turn"])
def test_chat_template_matches_transformers(tokenizer, messages):
    ours = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    theirs = tokenizer.hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    if isinstance(theirs, Mapping):  # transformers >= 5 returns a BatchEncoding
        theirs = theirs["input_ids"]
    assert ours == list(theirs)


def test_chat_template_text(tokenizer):
    text = tokenizer.render_chat(MESSAGES[0])
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    ids = tokenizer.apply_chat_template(MESSAGES[0])
    assert ids[0] == 1 and ids.count(2) == 2  # <|im_start|> ... two <|im_end|>


def test_hf_folder_tokenizer(tokenizer, tmp_path):
    tokenizer.hf.save_pretrained(tmp_path)
    again = Tokenizer.from_hf_folder(tmp_path)
    for text in TEXTS:
        assert again.encode(text) == tokenizer.encode(text)
    assert again.apply_chat_template(MESSAGES[1]) == tokenizer.apply_chat_template(MESSAGES[1])


def test_no_chat_template(tokenizer, tmp_path):
    tokenizer.hf.save_pretrained(tmp_path)
    plain = Tokenizer.from_hf_folder(tmp_path)
    plain.hf.chat_template = None
    with pytest.raises(ModelLoadError, match="no chat template: pass a plain text prompt"):
        plain.apply_chat_template(MESSAGES[0])


def test_bad_tokenizer_folder(tmp_path):
    with pytest.raises(ModelLoadError, match="cannot build a tokenizer"):
        Tokenizer.from_hf_folder(tmp_path)


def test_converted_tokenizer_is_cached(tokenizer, tmp_path, monkeypatch):
    """The first GGUF conversion is saved; the next build loads it and behaves the same."""
    monkeypatch.setenv("NANOGRAPH_CACHE_DIR", str(tmp_path))
    first = Tokenizer.from_gguf(smollm2_gguf(), extra_eos_token_ids=[2])
    entries = list((tmp_path / "tokenizers").iterdir())
    assert len(entries) == 1 and (entries[0] / "tokenizer.json").is_file()
    second = Tokenizer.from_gguf(smollm2_gguf(), extra_eos_token_ids=[2])
    for text in TEXTS:
        assert second.encode(text) == first.encode(text) == tokenizer.encode(text)
    for messages in MESSAGES:
        assert second.apply_chat_template(messages) == tokenizer.apply_chat_template(messages)
    assert second.eos_token_ids == tokenizer.eos_token_ids
    assert second.bos_token_id == tokenizer.bos_token_id


def test_unwritable_cache_is_skipped(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("NANOGRAPH_CACHE_DIR", str(blocked))
    assert Tokenizer.from_gguf(smollm2_gguf()).encode("Paris") != []
