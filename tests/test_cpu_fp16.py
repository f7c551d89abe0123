"""fp16 on the CPU: a model loaded with ``dtype=torch.float16`` (weights and KV cache in fp16, fp32 math) runs
prefill (per-op layers) and decode (the fused CPU decode step) and matches transformers in fp32; ``LLM`` and the
CLI accept an explicit fp16 on the CPU (the default for an fp16 checkpoint stays bf16 there).

Reference: transformers' MistralForCausalLM in fp32 on the same checkpoint. Tolerance: max |Δlogit| ≤ 5e-2 on
logits up to ~8 (std ~1.6): fp16 rounds weights, activations and the KV cache to 11 significant bits (measured:
0.025; the same model in bf16, 8 bits, is off by 0.25, and fp32 by 1e-5), and equal greedy tokens.

Shape letters: T tokens, V vocab.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mistral_kernels
from mistral_kernels import load_model
from mistral_kernels.batch import AttentionBatch
from mistral_kernels.cli import main

from .helpers.default_model_files import default_model_or_skip
from .helpers.model_helpers import greedy_transformers, logits_transformers

transformers = pytest.importorskip("transformers")

VOCAB, BLOCK, PROMPT, NEW = 49152, 8, 12, 6  # the default model's vocabulary (its tokenizer serves the LLM test)
ATOL = 5e-2


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    torch.manual_seed(0)
    cfg = transformers.MistralConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                     max_position_embeddings=128, initializer_range=0.2, sliding_window=None,
                                     attn_implementation="eager")
    hf = transformers.MistralForCausalLM(cfg).eval()
    path = tmp_path_factory.mktemp("fp16") / "hf"
    hf.save_pretrained(path)
    return path, hf


def test_fp16_prefill_and_fused_decode_match_transformers(checkpoint: tuple[Path, torch.nn.Module]) -> None:
    path, hf = checkpoint
    model = load_model(path, dtype=torch.float16, progress=False)
    assert model.dtype == torch.float16
    assert model.cpu_decode is not None  # decode steps run the fused native call in fp16
    ids = torch.randint(0, VOCAB, (PROMPT + NEW,), generator=torch.Generator().manual_seed(1))
    expected = logits_transformers(hf, ids)  # [T, V] fp32
    cache = model.new_cache(4, BLOCK)
    assert cache.k[0].dtype == torch.float16
    table = [3, 1, 0, 2]
    batch = AttentionBatch.build([table], [0], [PROMPT], BLOCK)
    got = [model.forward(ids[:PROMPT], batch, cache)]  # [PROMPT, V]
    for t in range(PROMPT, PROMPT + NEW - 1):  # teacher-forced decode steps
        got.append(model.forward(ids[t:t + 1], AttentionBatch.build([table], [t], [1], BLOCK), cache))
    logits = torch.cat(got)
    assert logits.dtype == torch.float32 and logits.shape == (PROMPT + NEW - 1, VOCAB)
    assert expected.abs().max() > 4.0  # the tolerance is meaningful at this scale
    torch.testing.assert_close(logits, expected[:-1], atol=ATOL, rtol=0)


def test_llm_generates_in_fp16_on_the_cpu(checkpoint: tuple[Path, torch.nn.Module]) -> None:
    path, hf = checkpoint
    llm = mistral_kernels.LLM(path, dtype=torch.float16, tokenizer=default_model_or_skip(), max_batch=2)
    assert llm.model.dtype == torch.float16
    prompt = llm.prompt_ids("The quick brown fox")
    [done] = llm.generate(["The quick brown fox"], max_new_tokens=NEW, ignore_eos=True)
    assert done.token_ids == greedy_transformers(hf, torch.tensor(prompt), NEW)


def test_cli_accepts_fp16_on_the_cpu(checkpoint: tuple[Path, torch.nn.Module],
                                     capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = checkpoint
    rc = main(["generate", "--model", str(path), "--tokenizer", str(default_model_or_skip()), "--prompt", "hi",
               "--dtype", "fp16", "--max-new-tokens", "3", "--ignore-eos"])
    assert rc == 0, capsys.readouterr().err
    assert "[stats]" in capsys.readouterr().err
