""":class:`EngineArgs`, the one definition of the engine flags: ``generate`` and ``serve`` parse the same flags
into the same object, its defaults are ``LLM``'s, and flags → EngineArgs → ``LLM`` keywords round-trips
every field."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
from typing import Any

import pytest
import torch

from mistral_kernels.cli import build_parser
from mistral_kernels.dataclass_cli import field_flags
from mistral_kernels.engine_args import EngineArgs
from mistral_kernels.llm import LLM
from mistral_kernels.speculative import SpeculativeConfig

# A valid, non-default value of every field.
VALUES: dict[str, Any] = {
    "model": "m.gguf", "tokenizer": "tok.json", "dtype": "bf16", "device": "cuda:1", "max_batch": 3,
    "block_size": 32, "num_blocks": 99, "max_tokens_per_step": 64, "enable_prefix_caching": False,
    "enforce_eager": True, "dequantize": True, "quantize": "int8", "check_tensors": True, "tp": 2,
    "moe_parallel": "tensor", "speculative": "draft", "draft_model": "d.gguf", "num_speculative_tokens": 4,
    "ngram_max": 5, "ngram_min": 1, "speculative_max_batch": 3, "speculative_row_cost": 0.25,
    "activations": "exact"}


def _subparser(name: str) -> argparse.ArgumentParser:
    sub = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)][0]
    return sub.choices[name]


def _argv(values: dict[str, Any]) -> list[str]:
    flags = field_flags(EngineArgs)
    argv: list[str] = []
    for name, value in values.items():
        if value is True:
            argv.append(flags[name])
        elif value is False:
            argv.append("--no-" + flags[name][2:])
        else:
            argv += [flags[name], str(value)]
    return argv


def test_value_table_covers_every_field() -> None:
    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    assert set(VALUES) == fields
    assert all(getattr(EngineArgs(), k) != v for k, v in VALUES.items())


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_flags_round_trip(command: str) -> None:
    parser = _subparser(command)
    assert EngineArgs.from_cli_args(parser.parse_args([])) == EngineArgs()
    assert EngineArgs.from_cli_args(parser.parse_args(_argv(VALUES))) == EngineArgs(**VALUES)


def test_info_takes_a_subset_of_the_same_flags() -> None:
    args = _subparser("info").parse_args(["--model", "m", "--dtype", "fp16", "--tp", "2", "--dequantize"])
    assert EngineArgs.from_cli_args(args) == EngineArgs(model="m", dtype="fp16", tp=2, dequantize=True)


def test_defaults_are_llms_and_kwargs_map_every_field() -> None:
    sig = inspect.signature(LLM.__init__)
    kwargs = EngineArgs().to_llm_kwargs()
    assert set(kwargs) <= set(sig.parameters)
    assert {k: sig.parameters[k].default for k in kwargs} == kwargs     # EngineArgs() is LLM()
    full = EngineArgs(**VALUES).to_llm_kwargs()
    assert full == {"path": "m.gguf", "device": "cuda:1", "dtype": torch.bfloat16, "max_batch": 3,
                    "block_size": 32, "num_blocks": 99, "max_tokens_per_step": 64, "tokenizer": "tok.json",
                    "prefix_caching": False, "enforce_eager": True, "quantized": False, "quantize": "int8",
                    "check_tensors": True, "activations": "exact",
                    "speculative": SpeculativeConfig(method="draft", num_tokens=4, ngram_max=5, ngram_min=1,
                                                     draft_model="d.gguf", max_batch=3, row_cost=0.25)}


def test_bad_values_are_parse_errors_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, message in [(["--max-batch", "0"], "argument --max-batch: max_batch must be ≥ 1, got 0"),
                          (["--dtype", "int4"], "argument --dtype: dtype must be one of"),
                          (["--activations", "fp8"], "argument --activations: activations must be one of"),
                          (["--num-blocks", "-2"], "argument --num-blocks: num_blocks must be ≥ 1")]:
        with pytest.raises(SystemExit):
            _subparser("serve").parse_args(argv)
        assert message in capsys.readouterr().err, argv
    with pytest.raises(ValueError, match="tp must be ≥ 1"):
        EngineArgs(tp=0)


def test_speculative_flags_that_do_not_go_together() -> None:
    with pytest.raises(ValueError, match="needs draft_model"):
        EngineArgs(speculative="draft").to_llm_kwargs()
    with pytest.raises(ValueError, match="--draft-model is given without --speculative draft"):
        EngineArgs(draft_model="d.gguf").to_llm_kwargs()
    with pytest.raises(ValueError, match="ngram_min"):
        EngineArgs(speculative="ngram", ngram_min=5).to_llm_kwargs()
    assert EngineArgs(speculative="ngram").to_llm_kwargs()["speculative"] == SpeculativeConfig()
