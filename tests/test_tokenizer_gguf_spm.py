"""The SentencePiece branch of the GGUF tokenizer (``tokenizer.ggml.model = "llama"``, what Mistral and Llama
GGUFs use) vs ``sentencepiece`` itself.

A tiny GGUF (metadata only) is written with ``gguf.GGUFWriter`` from the real Mistral SentencePiece models that
ship inside ``mistral-common``: the pieces, scores and piece types are read from the ``.model`` file (the
GGUF token types are SentencePiece's piece types, same numbers). Our ids must equal
``SentencePieceProcessor.encode`` on multilingual text with byte fallback, and decoding must round-trip.
"""

from __future__ import annotations

import random
from pathlib import Path

import gguf
import numpy as np
import pytest
import sentencepiece

from mistral_kernels import load_tokenizer
from mistral_kernels.tokenization import HFTokenizer

MODELS = {"v1": "tokenizer.model.v1",  # Mistral 7B v0.1: 32000 pieces, byte fallback
          "v3": "mistral_instruct_tokenizer_240323.model.v3"}  # + 768 control and 20 user-defined pieces

TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Le garçon a mangé une crème brûlée à Noël, où ça?",
    "北京是中国的首都。我们明天见！",
    "emoji 😀🎉👩‍👩‍👧 🇫🇷 and rare characters 𓀀 ꙮ 𐍈",
    "Здравствуй, мир! مرحبا بالعالم हिन्दी",
    "  leading  spaces\n\nnew lines\ttabs   ",
    " ",
    "",
    "x**2 + y_1 != 0; pi=3.14159",
]
USER_DEFINED_TEXTS = ["[REFERENCE_DOC_1] start", "mid[REFERENCE_DOC_2]dle end", "x [REFERENCE_DOC_3] y"]


def _read_model(path: Path) -> tuple[list[tuple[str, float, int]], bool]:
    """(piece, score, type) per id, and add_dummy_prefix, read by sentencepiece's own ModelProto (protobuf);
    the piece types are gguf's TokenType values."""
    from sentencepiece import sentencepiece_model_pb2  # needs protobuf (a test dependency)

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(path.read_bytes())
    return [(p.piece, p.score, p.type) for p in proto.pieces], proto.normalizer_spec.add_dummy_prefix


# ---- fixtures ------------------------------------------------------------------------------------------------

def _model_file(name: str) -> Path:
    mc = pytest.importorskip("mistral_common")
    path = Path(mc.__file__).parent / "data" / MODELS[name]
    if not path.is_file():
        pytest.fail(f"mistral-common data file missing: {path}")
    return path


@pytest.fixture(scope="module", params=sorted(MODELS))
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """(our tokenizer from the GGUF, sentencepiece's processor, model name)."""
    model = _model_file(request.param)
    sp = sentencepiece.SentencePieceProcessor(model_file=str(model))
    pieces, add_dummy_prefix = _read_model(model)
    assert [p for p, _, _ in pieces] == [sp.id_to_piece(i) for i in range(sp.vocab_size())]
    assert [s for _, s, _ in pieces] == [sp.get_score(i) for i in range(sp.vocab_size())]
    types = [t for _, _, t in pieces]
    for i in range(sp.vocab_size()):  # the reader's types agree with what sentencepiece reports
        assert (types[i] == gguf.TokenType.CONTROL) == sp.is_control(i)
        assert (types[i] == gguf.TokenType.BYTE) == sp.is_byte(i)
        assert (types[i] == gguf.TokenType.UNKNOWN) == sp.is_unknown(i)

    path = tmp_path_factory.mktemp("spm") / f"mistral-{request.param}.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list([p for p, _, _ in pieces])
    w.add_token_scores([s for _, s, _ in pieces])
    w.add_token_types(types)
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(add_dummy_prefix)
    w.add_tensor("dummy", np.zeros(1, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tok = load_tokenizer(path)
    assert isinstance(tok, HFTokenizer) and tok.kind == "gguf"
    return tok, sp, request.param


# ---- tests ---------------------------------------------------------------------------------------------------

def test_ids_equal_sentencepiece(pair) -> None:
    tok, sp, name = pair
    texts = TEXTS + (USER_DEFINED_TEXTS if name == "v3" else [])
    for text in texts:
        assert tok.encode(text, add_special_tokens=False) == sp.encode(text), text
        assert tok.encode(text) == [sp.bos_id()] + sp.encode(text), text
    assert tok.bos_id == sp.bos_id() and tok.eos_ids == {sp.eos_id()}
    # byte fallback is exercised: the rare characters are <0xNN> pieces
    assert any(sp.is_byte(i) for i in sp.encode(TEXTS[4]))


def test_decode_round_trips(pair) -> None:
    tok, sp, name = pair
    for text in TEXTS + (USER_DEFINED_TEXTS if name == "v3" else []):
        ids = tok.encode(text)
        assert tok.decode(ids) == sp.decode(ids) == text, text


def test_random_texts_equal_sentencepiece(pair) -> None:
    """Concatenations of vocabulary pieces and random characters (Latin, CJK, emoji, rare planes): the merge
    order rebuilt from the scores must reproduce SentencePiece's segmentation everywhere."""
    tok, sp, _ = pair
    rng = random.Random(0)
    vocab = [sp.id_to_piece(i).replace("\u2581", " ") for i in range(sp.vocab_size())
             if not (sp.is_control(i) or sp.is_byte(i) or sp.is_unknown(i))]
    chars = [chr(c) for c in [*range(0x20, 0x7F), *range(0xC0, 0x250), *range(0x4E00, 0x4F00),
                              *range(0x1F600, 0x1F650), 0x13000, 0xA66E, 0x10348, 0x0A]]
    for _ in range(300):
        text = "".join(rng.choice(vocab) if rng.random() < 0.7 else
                       "".join(rng.choice(chars) for _ in range(rng.randint(1, 4)))
                       for _ in range(rng.randint(1, 12)))
        if any(t in text for t in ("<s>", "</s>", "<unk>")):
            continue
        assert tok.encode(text, add_special_tokens=False) == sp.encode(text), text


def test_control_tokens_in_text(pair) -> None:
    """Control tokens are not text to SentencePiece; chat templates spell them out, so they are matched in the
    text, and each text part after one gets its own "▁" prefix (llama.cpp's rule)."""
    tok, sp, name = pair
    control = "[INST]" if name == "v3" else "</s>"
    text = f"<s>{control}Hi there{control} x"
    want = [sp.bos_id(), sp.piece_to_id(control), *sp.encode("Hi there"), sp.piece_to_id(control),
            *sp.encode(" x")]
    assert sp.is_control(sp.piece_to_id(control))
    assert tok.encode(text, add_special_tokens=False) == want


def test_streaming_decode(pair) -> None:
    tok, sp, name = pair
    for text in TEXTS + (USER_DEFINED_TEXTS if name == "v3" else []):
        ids = tok.encode(text)
        dec = tok.incremental_decoder()
        pieces = [dec.push([i]) for i in ids] + [dec.flush()]
        assert "".join(pieces) == sp.decode(ids), text
        assert not any("\ufffd" in p for p in pieces), text  # never half a character


def test_streaming_recovers_from_a_decode_that_rewrites_emitted_text(pair) -> None:
    """A byte-fallback run "<0x28>" "<0xB6>" decodes as "(" then, once the stray byte joins the run, as two
    U+FFFD: the decode stops extending the emitted "(" and tokenizers' DecodeStream raises. The decoder goes
    on (the past cannot be taken back) and the following tokens stream normally."""
    from tokenizers.decoders import DecodeStream

    tok, sp, _ = pair
    ids = [sp.piece_to_id("<0x28>"), sp.piece_to_id("<0xB6>"), sp.piece_to_id("rd")]
    raw = DecodeStream(skip_special_tokens=True)
    with pytest.raises(Exception, match="Invalid prefix"):
        for i in ids:
            raw.step(tok.backend, i)
    dec = tok.incremental_decoder()
    assert dec.push(ids[:1]) == "("
    assert dec.push(ids[1:]).endswith("rd")
    world = sp.encode("Hello world")[1:]  # "▁world"
    assert dec.push(world) == " world"
    assert dec.flush() == ""
