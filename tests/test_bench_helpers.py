"""The benchmarks' helper logic: the bytes of a decode step (benchmarks/roofline.py) against the config's
parameter count and the GGUF file's stored tensor sizes, and the parsing of llama.cpp's output
(benchmarks/llamacpp_output.py) on output captured from llama-bench / llama-completion."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from mistral_kernels import load_model
from mistral_kernels.config import ModelConfig

from .model_helpers import random_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from llamacpp_output import parse_bench_jsonl, parse_completion_timings  # noqa: E402
from roofline import step_bytes  # noqa: E402

gguf = pytest.importorskip("gguf")
from .quant_checkpoints import write_quant_gguf  # noqa: E402

LLAMA = ModelConfig(dim=256, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64, hidden_dim=256, vocab_size=320,
                    rope_is_neox=False, max_position=128)
MIXTRAL = ModelConfig(**{**vars(LLAMA), "num_experts": 4, "top_k": 2})


@pytest.mark.parametrize("config", [LLAMA, MIXTRAL], ids=["dense", "moe"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_dense_step_bytes_are_the_active_parameters(config: ModelConfig, dtype: torch.dtype) -> None:
    """Untied model: every active parameter but the input embedding, once; KV = context × bytes per token."""
    model = random_model(config, dtype=dtype)
    b = step_bytes(model, context=10.5)
    es = dtype.itemsize
    assert b.weights == (config.num_parameters(active_only=True) - config.vocab_size * config.dim) * es
    assert b.head == (config.vocab_size + 1) * config.dim * es  # LM head + final norm
    assert b.kv == round(10.5 * 2 * config.n_layers * config.n_kv_heads * config.head_dim * es)
    assert b.total == b.layers + b.head + b.kv


def test_packed_step_bytes_are_the_stored_blocks(tmp_path: Path) -> None:
    """Native Q4_1 layers + a tied Q8_0 embedding: the file's block bytes of every matrix (the embedding once,
    as the head), the norms in the activation dtype."""
    path = tmp_path / "q41.gguf"
    tied = ModelConfig(**{**vars(LLAMA), "tie_embeddings": True})
    write_quant_gguf(path, tied, lambda name, shape: "Q8_0" if "token_embd" in name else "Q4_1")
    stored = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(path).tensors}
    matrices = sum(n for name, n in stored.items() if name.startswith("blk.") and "norm" not in name)
    norms = 2 * tied.n_layers * tied.dim * 2  # bf16
    b = step_bytes(load_model(path, dtype=torch.bfloat16), context=0)
    assert b.layers == matrices + norms
    assert b.head == stored["token_embd.weight"] + tied.dim * 2
    assert b.kv == 0


# Captured from llama-bench / llama-completion built from llama-cpp-python 0.3.36's vendored llama.cpp.
BENCH_JSONL = """\
"""

COMPLETION_TAIL = """\
"""


def test_parse_llama_bench_jsonl() -> None:
    (r,) = parse_bench_jsonl(BENCH_JSONL)
    assert (r.n_prompt, r.n_gen, r.n_depth, r.n_threads) == (0, 8, 42, 2)
    assert r.avg_ts == pytest.approx(0.0)


def test_parse_llama_completion_timings() -> None:
    t = parse_completion_timings(COMPLETION_TAIL)
    assert (t.prompt_tokens, t.eval_runs) == (42, 7)
    assert t.prompt_tok_s == pytest.approx(0.0)
    assert t.eval_tok_s == pytest.approx(0.0)


def test_parse_errors_show_the_output() -> None:
    with pytest.raises(ValueError, match="no jsonl result.*error: failed"):
        parse_bench_jsonl("main: error: failed to load model\n")
    with pytest.raises(ValueError, match="no timing lines"):
        parse_completion_timings("llama_model_load: error loading model\n")
