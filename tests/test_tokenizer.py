"""Tokenizers vs their references: the SmolLM2 GGUF tokenizer vs transformers' (ids, chat prompt), an HF
tokenizer.json directory, mistral-common tekken / SentencePiece files, and streaming decode. (The SentencePiece
GGUF branch vs sentencepiece: test_tokenizer_gguf_spm.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mistral_kernels import load_tokenizer
from mistral_kernels.tokenization import HFTokenizer, IncrementalDecoder, MistralCommonTokenizer, StreamDecoder

from .helpers.default_model_files import default_model_or_skip

TEXTS = [
    "Hello world",
    "What is the capital of France?",
    "héllo wörld — naïve café 😀 日本語のテキスト",
    "  leading  spaces\n\nnew lines\ttabs   ",
    "it's <|im_start|>user\nhi<|im_end|>",
    "price 2024, pi=3.14159; x**2 + y_1 != 0",
    "",
]


@pytest.fixture(scope="module")
def gguf_path() -> Path:
    return default_model_or_skip()


@pytest.fixture(scope="module")
def smol(gguf_path: Path) -> HFTokenizer:
    tok = load_tokenizer(gguf_path)
    assert isinstance(tok, HFTokenizer) and tok.kind == "gguf"
    return tok


@pytest.fixture(scope="module")
def hf_smol(gguf_path: Path):  # transformers' tokenizer built from the same GGUF
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)


def test_gguf_ids_match_transformers(smol: HFTokenizer, hf_smol) -> None:
    for text in TEXTS:
        assert smol.encode(text) == hf_smol.encode(text), text
        ids = smol.encode(text)
        assert smol.decode(ids) == hf_smol.decode(ids, skip_special_tokens=True), text
    assert smol.eos_ids == {hf_smol.eos_token_id} and smol.bos_id == hf_smol.bos_token_id


def test_gguf_chat_template_matches_transformers(smol: HFTokenizer, hf_smol) -> None:
    conversations = [
        [{"role": "user", "content": "What is the capital of France?"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Héllo 😀"},
         {"role": "assistant", "content": "Hi!"}, {"role": "user", "content": "Again"}],
    ]
    for messages in conversations:
        want = hf_smol.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert smol.render_chat(messages) == want
        want_ids = hf_smol.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        want_ids = want_ids["input_ids"] if hasattr(want_ids, "keys") else want_ids
        assert smol.apply_chat_template(messages) == list(want_ids)
    assert smol.render_chat(conversations[0]).endswith("<|im_start|>assistant\n")


def test_hf_tokenizer_json_directory(tmp_path: Path, hf_smol) -> None:
    hf_smol.save_pretrained(tmp_path)
    assert (tmp_path / "tokenizer.json").is_file()
    tok = load_tokenizer(tmp_path)
    assert isinstance(tok, HFTokenizer) and tok.kind == "hf"
    for text in TEXTS:
        assert tok.encode(text) == hf_smol.encode(text), text
    messages = [{"role": "user", "content": "2+2?"}]
    want = hf_smol.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert tok.render_chat(messages) == want
    assert tok.eos_ids == {hf_smol.eos_token_id}
    # a tokenizer.json path works too
    assert load_tokenizer(tmp_path / "tokenizer.json").encode("Hello") == hf_smol.encode("Hello")


def _mistral_common_files() -> list[Path]:
    mc = pytest.importorskip("mistral_common")
    data = Path(mc.__file__).parent / "data"
    files = [data / "tekken_240911.json", data / "mistral_instruct_tokenizer_240323.model.v3"]
    if not all(f.is_file() for f in files):
        pytest.fail(f"mistral-common data files missing: {files}")
    return files


@pytest.mark.parametrize("which", [0, 1], ids=["tekken", "spm-v3"])
def test_mistral_common_round_trip_and_chat(which: int) -> None:
    from mistral_common.protocol.instruct.messages import SystemMessage, UserMessage
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    path = _mistral_common_files()[which]
    tok = load_tokenizer(path)
    assert isinstance(tok, MistralCommonTokenizer)
    ref = MistralTokenizer.from_file(str(path))
    raw = ref.instruct_tokenizer.tokenizer
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids == raw.encode(text, bos=True, eos=False)
        assert ids[0] == tok.bos_id
        assert tok.decode(ids) == text, text                    # round trip
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Héllo 😀"}]
    want = ref.encode_chat_completion(ChatCompletionRequest(
        messages=[SystemMessage(content="Be brief."), UserMessage(content="Héllo 😀")])).tokens
    assert tok.apply_chat_template(messages) == want
    assert tok.eos_ids == {raw.eos_id}


def _stream(tok, ids: list[int]) -> list[str]:
    dec = tok.incremental_decoder()
    pieces = [dec.push([i]) for i in ids]
    pieces.append(dec.flush())
    return pieces


def test_incremental_decode_multibyte_and_spaces(smol: HFTokenizer) -> None:
    tokenizers = [smol] + [load_tokenizer(p) for p in _mistral_common_files()]
    # tokenizers-backed kinds stream through tokenizers' DecodeStream; mistral-common re-decodes a window
    assert [type(t.incremental_decoder()) for t in tokenizers] == [StreamDecoder, IncrementalDecoder,
                                                                   IncrementalDecoder]
    for tok in tokenizers:
        for text in TEXTS:
            ids = tok.encode(text, add_special_tokens=False)
            pieces = _stream(tok, ids)
            assert "".join(pieces) == tok.decode(ids), (tok.kind, text)
            assert not any("\ufffd" in p for p in pieces), (tok.kind, text)   # never half a character
    # An emoji is several byte-level tokens in SmolLM2: nothing is emitted until it is complete.
    ids = smol.encode("😀")
    assert len(ids) > 1
    dec = smol.incremental_decoder()
    assert [dec.push([i]) for i in ids] == [""] * (len(ids) - 1) + ["😀"]
    # SentencePiece: the space of "▁world" appears between the words, not lost or doubled.
    spm = load_tokenizer(_mistral_common_files()[1])
    ids = spm.encode("Hello world again", add_special_tokens=False)
    assert "".join(_stream(spm, ids)) == "Hello world again"


def test_incremental_decoder_is_reusable_after_flush(smol: HFTokenizer) -> None:
    """flush ends a text; the next push starts a new one (no context carried over)."""
    for tok in [smol, load_tokenizer(_mistral_common_files()[1])]:
        dec = tok.incremental_decoder()
        for text in ["Héllo 😀 wörld", "日本語 again"]:
            ids = tok.encode(text, add_special_tokens=False)
            assert "".join(dec.push([i]) for i in ids) + dec.flush() == tok.decode(ids), (tok.kind, text)


def test_compat_module_reexports() -> None:
    import mistral_kernels.tokenization as new
    import mistral_kernels.tokenizer as old

    for name in ["Tokenizer", "IncrementalDecoder", "HFTokenizer", "MistralCommonTokenizer", "load_tokenizer",
                 "Message"]:
        assert getattr(old, name) is getattr(new, name), name


def test_bad_paths(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_tokenizer(tmp_path / "nope.json")
    with pytest.raises(FileNotFoundError, match="no tokenizer in directory"):
        load_tokenizer(tmp_path)
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"hello": 1}))
    with pytest.raises(ValueError, match="neither an HF tokenizer.json nor a tekken.json"):
        load_tokenizer(bad)
