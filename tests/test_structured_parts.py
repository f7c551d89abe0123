"""The parts of constrained decoding on a toy vocabulary (one character per token, '!' = EOS): the vocabulary
built once per tokenizer, specs compiled once (LRU), the per-request state (accept / rollback /
masks_for_proposals for speculative decoding), the command-line flags, and the engine path running the
emulated CUDA kernels on a tiny random model."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import torch

import mistral_kernels
from mistral_kernels.config import ModelConfig
from mistral_kernels.engine import Engine
from mistral_kernels.sampling_params import SamplingParams
from mistral_kernels.structured import Choice, Grammar, JsonObject, JsonSchema, Regex
from mistral_kernels.structured.grammar import GrammarCompiler
from mistral_kernels.structured.vocab import grammar_vocabulary, special_token_ids

from .helpers.engine import ALPHABET, CharTokenizer, ToyModel
from .helpers.model_helpers import random_model

TOK = CharTokenizer()
V = 64  # the model's vocabulary: 50 characters + 14 padding ids the tokenizer lacks
EOS = 49


def _allowed(row: torch.Tensor) -> set[int]:
    """Token ids whose bit is set in an int32 bitmask row, read bit by bit."""
    return {t for t in range(32 * row.numel()) if (int(row[t // 32]) >> (t % 32)) & 1}


def _ids(text: str) -> list[int]:
    return TOK.encode(text)


def _chars(ids: set[int]) -> set[str]:
    return {ALPHABET[i] for i in ids}


def test_vocabulary_is_built_once_per_tokenizer() -> None:
    a = grammar_vocabulary(TOK, V, [EOS])
    assert grammar_vocabulary(TOK, V, [EOS]) is a
    assert grammar_vocabulary(CharTokenizer(), V, [EOS]) is not a  # another tokenizer object
    assert special_token_ids(TOK, V) == [EOS]  # '!' is dropped when special tokens are skipped
    with pytest.raises(ValueError, match=r"need EOS token ids in \[0, 64\)"):
        grammar_vocabulary(TOK, V, [])


def test_masks_follow_the_grammar_and_padding_ids_are_never_allowed() -> None:
    state = GrammarCompiler(TOK, V, [EOS]).state(Regex("ab+c"))
    row = torch.empty(2, dtype=torch.int32)
    state.fill(row)
    assert _chars(_allowed(row)) == {"a"}
    assert state.accept(_ids("a")[0]) is False
    state.fill(row)
    assert _chars(_allowed(row)) == {"b"}
    for t in _ids("bb"):
        assert state.accept(t) is False
    state.fill(row)
    assert _chars(_allowed(row)) == {"b", "c"}
    assert state.accept(_ids("c")[0]) is True  # complete: the request finishes
    state.fill(row)
    assert _allowed(row) == {EOS}  # only EOS after a complete sentence; never an id ≥ 50
    with pytest.raises(ValueError, match="row must be a contiguous CPU int32"):
        state.fill(torch.empty(3, dtype=torch.int32))


def test_eos_only_where_the_grammar_accepts() -> None:
    state = GrammarCompiler(TOK, V, [EOS]).state(Regex("a+"))
    row = torch.empty(2, dtype=torch.int32)
    state.fill(row)
    assert EOS not in _allowed(row)
    state.accept(_ids("a")[0])
    state.fill(row)
    assert _allowed(row) == {_ids("a")[0], EOS}


def test_masks_for_proposals_and_rollback() -> None:
    state = GrammarCompiler(TOK, V, [EOS]).state(Regex("ab+c"))
    a, b, c, x = (_ids(ch)[0] for ch in "abcx")
    masks = state.masks_for_proposals([a, b, b])
    assert masks.shape == (4, 2) and masks.dtype == torch.int32
    assert [_chars(_allowed(r)) for r in masks] == [{"a"}, {"b"}, {"b", "c"}, {"b", "c"}]
    # the state is where it was: the mask now is still {a}
    row = torch.empty(2, dtype=torch.int32)
    state.fill(row)
    assert _chars(_allowed(row)) == {"a"}
    # the grammar rejects proposal 1 ('x'): rows after it are all-allowed (-1), row 1 excludes 'x'
    masks = state.masks_for_proposals([a, x, b])
    assert x not in _allowed(masks[1]) and bool((masks[2:] == -1).all())
    # proposals that complete the grammar: the next row allows only EOS, the rows after it all
    masks = state.masks_for_proposals([a, b, c, EOS, a])
    assert _allowed(masks[3]) == {EOS} and bool((masks[4:] == -1).all())
    # accept two, roll one back
    state.accept(a)
    state.accept(b)
    state.rollback(1)
    state.fill(row)
    assert _chars(_allowed(row)) == {"b"}
    with pytest.raises(ValueError, match=r"rollback\(5\)"):
        state.rollback(5)


def test_compiled_specs_are_cached_least_recently_used_first_out() -> None:
    comp = GrammarCompiler(TOK, V, [EOS], capacity=2)
    first = comp.compile(Regex("a+"))
    assert comp.compile(Regex("a+")) is first
    comp.compile(Regex("b+"))
    comp.compile(Regex("a+"))  # a+ is now the most recent
    comp.compile(Regex("c+"))  # drops b+
    assert comp.compile(Regex("a+")) is first
    assert list(comp._compiled) == [Regex("c+"), Regex("a+")]
    # copies of one compiled spec have their own state
    s1, s2 = comp.state(Choice(["ab", "ac"])), comp.state(Choice(["ab", "ac"]))
    s1.accept(_ids("a")[0])
    row = torch.empty(2, dtype=torch.int32)
    s2.fill(row)
    assert _chars(_allowed(row)) == {"a"}


def test_toy_engine_choice_and_regex() -> None:
    eng = Engine(ToyModel(), TOK, num_blocks=64, block_size=4, max_batch=4)
    outs = eng.generate([(_ids("hello"), SamplingParams(structured=Choice(["cat", "dog"]), max_new_tokens=10)),
                         (_ids("hello"), SamplingParams(max_new_tokens=6, ignore_eos=True)),
                         (_ids("abc"), SamplingParams(structured=Regex("[a-d]{3} [A-D]"), temperature=1.0,
                                                      seed=1, max_new_tokens=10))])
    assert outs[0].text in ("cat", "dog") and outs[0].finish_reason == "stop"
    assert re.fullmatch("[a-d]{3} [A-D]", outs[2].text) and outs[2].finish_reason == "stop"
    alone = Engine(ToyModel(), TOK, num_blocks=64, block_size=4, max_batch=4).generate(
        [(_ids("hello"), SamplingParams(max_new_tokens=6, ignore_eos=True))])
    assert outs[1].token_ids == alone[0].token_ids


EMU = ModelConfig(dim=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=64, hidden_dim=48, vocab_size=V,
                  max_position=96, eos_token_ids=(EOS,))  # head_dim 64: a size the CUDA kernels are built for


def test_engine_with_the_emulated_cuda_kernels() -> None:
    if not mistral_kernels.emulator_compiled():
        pytest.skip("emulated kernels not built (MK_EMU=OFF); .ci/run requires them")
    from mistral_kernels import emulated

    model = random_model(EMU, kernels=emulated, seed=3)
    eng = Engine(model, TOK, num_blocks=32, block_size=4, max_batch=2)
    pattern = "[a-e]{2,4} [A-E]"
    outs = eng.generate([(_ids("hello"), SamplingParams(structured=Regex(pattern), max_new_tokens=12)),
                         (_ids("abc"), SamplingParams(structured=Regex(pattern), temperature=1.0, seed=2,
                                                      max_new_tokens=12))])
    for c in outs:
        assert c.finish_reason == "stop" and re.fullmatch(pattern, c.text), c.text
        assert all(t < 50 for t in c.token_ids)  # padding ids (no bytes) are never sampled


# ------------------------------------------------------------------ command line
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    SamplingParams.add_cli_args(p)
    return p


def test_cli_flags_build_the_spec(tmp_path: Path) -> None:
    schema = tmp_path / "s.json"
    schema.write_text('{"type": "object", "properties": {"a": {"type": "integer"}}}')
    gbnf = tmp_path / "g.gbnf"
    gbnf.write_text('root ::= "yes" | "no"\n')
    lark = tmp_path / "g.lark"
    lark.write_text('start: "yes" | "no"\n')
    cases = [([], None), (["--json-object"], JsonObject()),
             (["--json-schema", str(schema)], JsonSchema({"type": "object", "properties": {"a": {"type": "integer"}}})),
             (["--grammar", str(gbnf)], Grammar('root ::= "yes" | "no"\n', "gbnf")),
             (["--grammar", str(lark)], Grammar('start: "yes" | "no"\n', "lark")),
             (["--regex", "[0-9]+"], Regex("[0-9]+")),
             (["--choice", "yes", "--choice", "no"], Choice(["yes", "no"]))]
    for argv, want in cases:
        assert SamplingParams.from_cli_args(_parser().parse_args(argv)).structured == want, argv


def test_cli_flags_refuse_bad_values(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad_schema = tmp_path / "bad.json"
    bad_schema.write_text('{"type": "strin"}')
    not_json = tmp_path / "nj.json"
    not_json.write_text("{oops")
    txt = tmp_path / "g.txt"
    txt.write_text('root ::= "a"')
    bad_gbnf = tmp_path / "b.gbnf"
    bad_gbnf.write_text('root ::= "a" | bogus')
    for argv, message in [
        (["--json-schema", str(tmp_path / "missing.json")], "argument --json-schema: cannot read"),
        (["--json-schema", str(not_json)], "argument --json-schema: structured: the JSON schema is not valid JSON"),
        (["--json-schema", str(bad_schema)], "argument --json-schema: structured: invalid JSON schema"),
        (["--grammar", str(txt)], "argument --grammar: " + str(txt) + ": the grammar file's suffix says its syntax: "
                                  ".gbnf or .lark"),
        (["--grammar", str(bad_gbnf)], "argument --grammar: structured: the GBNF grammar does not convert"),
        (["--regex", "a(b"], "argument --regex: structured: invalid regex"),
        (["--choice", ""], "argument --choice: a choice must be a non-empty string"),
        (["--regex", "a", "--json-object"], "argument --json-object: not allowed with argument --regex"),
    ]:
        with pytest.raises(SystemExit):
            _parser().parse_args(argv)
        assert message in capsys.readouterr().err, argv


def test_stream_and_engine_without_tokenizer() -> None:
    from mistral_kernels.llm import LLM

    llm = LLM.__new__(LLM)  # no checkpoint: stream uses only the tokenizer and the engine
    llm.tokenizer = TOK
    llm.engine = Engine(ToyModel(), TOK, num_blocks=64, block_size=4, max_batch=2)
    pieces = list(llm.stream("hello", structured=Regex("[a-d]{3}x"), temperature=1.0, seed=4, max_new_tokens=10))
    assert "".join(pieces) == llm.last_completion.text and re.fullmatch("[a-d]{3}x", llm.last_completion.text)
    bare = Engine(ToyModel(), None, num_blocks=64, block_size=4, max_batch=2)
    with pytest.raises(ValueError, match="params.structured needs an engine with a tokenizer"):
        bare.add_request([1, 2], SamplingParams(structured=Regex("a")))
