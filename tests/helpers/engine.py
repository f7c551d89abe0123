"""Helpers of tests/test_engine.py that other tests share."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from mistral_kernels.batch import AttentionBatch
from mistral_kernels.config import ModelConfig
from mistral_kernels.scheduler import Scheduler, SchedulerOutput
from mistral_kernels.tokenizer import Tokenizer


ALPHABET = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTU.!"  # toy vocabulary: 50 characters


class CharTokenizer(Tokenizer):
    """One character per token of ``alphabet`` (default ALPHABET: id 49); its last character is EOS."""

    kind = "toy"
    bos_id = None

    def __init__(self, alphabet: str = ALPHABET) -> None:
        self.alphabet = alphabet
        self.eos_ids = frozenset({len(alphabet) - 1})
        self.vocab_size = len(alphabet)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [self.alphabet.index(c) for c in text]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(self.alphabet[i] for i in ids if not (skip_special_tokens and i in self.eos_ids))

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> list[int]:
        return self.encode(" ".join(m["content"] for m in messages))


class ToyModel:
    """Cache: float64 [N, S] holding token ids (NaN = never written). Next-token logits peak at a hash of the
    tokens a query sees (positions p-W < j ≤ p), read through the block table."""

    def __init__(self, vocab: int = 50, window: int | None = None) -> None:
        self.config = ModelConfig(dim=1, n_layers=1, n_heads=1, n_kv_heads=1, head_dim=1, hidden_dim=1,
                                  vocab_size=vocab, sliding_window=window, max_position=4096, eos_token_ids=(49,))
        self.device = torch.device("cpu")
        self.dtype = torch.float32
        self.steps: list[tuple[int, int]] = []  # (sequences, tokens) per forward

    def new_cache(self, num_blocks: int, block_size: int) -> torch.Tensor:
        return torch.full((num_blocks, block_size), float("nan"), dtype=torch.float64)

    def forward(self, token_ids: torch.Tensor, batch: AttentionBatch, cache: torch.Tensor) -> torch.Tensor:
        bs = cache.shape[1]
        flat = cache.view(-1)
        keep = batch.slot_mapping >= 0
        flat[batch.slot_mapping[keep]] = token_ids[keep].double()
        rows = batch.logits_indices if batch.logits_indices is not None else torch.arange(token_ids.shape[0])
        cu = batch.cu_seqlens_q.tolist()
        self.steps.append((len(cu) - 1, token_ids.shape[0]))
        v = self.config.vocab_size
        out = []
        for t in rows.tolist():
            b = max(i for i in range(len(cu) - 1) if cu[i] <= t)
            p = int(batch.positions[t])
            w = self.config.sliding_window
            lo = max(0, p - w + 1) if w else 0
            js = torch.arange(lo, p + 1)
            toks = cache[batch.block_tables[b, js // bs].long(), js % bs]
            assert not torch.isnan(toks).any(), "read a slot that was never written"
            h = int(((toks * (js + 1) * 7 + toks * toks * 3).sum() + 11 * (p + 1)) % v)
            logits = -((torch.arange(v) - h) % v).double() * 0.7
            out.append(logits)
        return torch.stack(out).float() if out else torch.empty(0, v)


# ------------------------------------------------------------------------ real tiny Mistral vs transformers
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny_mistral(tmp_path_factory: pytest.TempPathFactory):
    from mistral_kernels import load_model

    torch.manual_seed(0)
    cfg = transformers.MistralConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                     max_position_embeddings=256, initializer_range=0.2, rms_norm_eps=1e-5,
                                     sliding_window=16, attn_implementation="eager")
    hf = transformers.MistralForCausalLM(cfg).eval()
    path: Path = tmp_path_factory.mktemp("tiny_mistral")
    hf.save_pretrained(path)
    model = load_model(path, progress=False)
    assert model.config.sliding_window == 16
    return model, hf


def fake_step(s: Scheduler) -> SchedulerOutput:
    """Schedule, pretend the forward ran, and give every sampling request one token (id 0)."""
    out = s.schedule()
    s.commit(out)
    for r in out.sampling_requests:
        r.output_ids.append(0)
    return out
