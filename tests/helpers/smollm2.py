"""Helpers of tests/test_smollm2.py that other tests share."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mistral_kernels import load_model
from mistral_kernels.model import Model

from .default_model_files import default_model_or_skip


transformers = pytest.importorskip("transformers")


PROMPT = ("<|im_start|>user\nWhat is the capital of France, and what is it famous for?<|im_end|>\n"
          "<|im_start|>assistant\n")


@pytest.fixture(scope="session")
def gguf_path() -> Path:
    return default_model_or_skip()


@pytest.fixture(scope="session")
def reference(gguf_path: Path) -> torch.nn.Module:
    return transformers.AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def ours(gguf_path: Path) -> Model:
    # exact activations: transformers parity (docs/design.md §5) and batching invariants hold for the exact path
    return load_model(gguf_path, progress=False, activations="exact")


@pytest.fixture(scope="session")
def prompt_ids(gguf_path: Path) -> torch.Tensor:
    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    return torch.tensor(tokenizer.encode(PROMPT), dtype=torch.int64)
