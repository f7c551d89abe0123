"""A checkpoint is read once: ``LLM(path)`` on a GGUF opens the file at most twice (header once, data once —
here once: one descriptor serves both) and parses its header once, whatever it asks of the checkpoint
(config, dtype, footprint, weights, tokenizer).

Counted by wrapping ``open`` / ``io.open`` / ``os.open`` (opens of the file under test) and the GGUF header
parser; ``gguf.GGUFReader`` must not be built at all. The counters are shown to see a second read: loading the
tokenizer from the path after opening the checkpoint is two parses.
"""

from __future__ import annotations

import builtins
import io
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import mistral_kernels
from mistral_kernels.checkpoint import Checkpoint, CheckpointError, load_checkpoint, load_config
from mistral_kernels.checkpoint import gguf_header
from mistral_kernels.config import ModelConfig
from mistral_kernels.tokenization import load_tokenizer

from .helpers.quant_checkpoints import Q4_K_M, write_quant_gguf
from .helpers.random_checkpoints import write_random_checkpoint

gguf = pytest.importorskip("gguf")

CONFIG = ModelConfig(dim=256, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64, hidden_dim=256, vocab_size=128,
                     tie_embeddings=True, max_position=256, rope_is_neox=False)
_CHARS = [chr(c) for c in range(ord("!"), ord("!") + 93)] + ["!!"]  # characters of GPT-2's byte alphabet
_CONTROLS = [f"<|c{i}|>" for i in range(CONFIG.vocab_size - len(_CHARS))]


def _tokenizer_metadata(w: gguf.GGUFWriter) -> None:
    """A byte-level BPE tokenizer over 93 characters and one merge + control tokens, EOS the first control."""
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(_CHARS + _CONTROLS)
    w.add_token_types([1] * len(_CHARS) + [3] * len(_CONTROLS))
    w.add_token_merges(["! !"])
    w.add_eos_token_id(len(_CHARS))


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Q4_K_M-like GGUF (matrices stay packed: Q4_K / Q6_K) with a tied head and a tokenizer."""
    path = tmp_path_factory.mktemp("ckpt") / "tiny.gguf"
    write_quant_gguf(path, CONFIG, Q4_K_M, metadata=_tokenizer_metadata)
    return path


class Reads:
    """Opens of one file and GGUF header parses, counted while installed (:func:`count_reads`)."""

    def __init__(self) -> None:
        self.opens = 0
        self.parses = 0


@pytest.fixture
def count_reads(monkeypatch: pytest.MonkeyPatch) -> Callable[[Path], Reads]:
    def install(path: Path) -> Reads:
        reads = Reads()
        target = os.path.realpath(path)

        def ours(file: object) -> bool:
            return isinstance(file, (str, bytes, os.PathLike)) and os.path.realpath(file) == target

        def wrap(real: Callable[..., object]) -> Callable[..., object]:
            def counted(file: object, *args: object, **kwargs: object) -> object:
                if ours(file):
                    reads.opens += 1
                return real(file, *args, **kwargs)
            return counted

        monkeypatch.setattr(builtins, "open", wrap(builtins.open))
        monkeypatch.setattr(io, "open", wrap(io.open))  # pathlib opens through io.open
        monkeypatch.setattr(os, "open", wrap(os.open))
        parse = gguf_header._read

        def counted_parse(fd: int, p: Path) -> gguf_header.GGUFHeader:
            reads.parses += 1
            return parse(fd, p)

        def refuse(*args: object, **kwargs: object) -> None:
            raise AssertionError("gguf.GGUFReader built: the header is parsed by gguf_header")

        monkeypatch.setattr(gguf_header, "_read", counted_parse)
        monkeypatch.setattr(gguf, "GGUFReader", refuse)
        return reads

    return install


def test_llm_reads_a_gguf_once(gguf_path: Path, count_reads: Callable[[Path], Reads]) -> None:
    reads = count_reads(gguf_path)
    llm = mistral_kernels.LLM(gguf_path, max_batch=1, num_blocks=8)
    assert (reads.opens, reads.parses) == (1, 1)
    # what it loaded is the whole model: packed matrices, the tied head, the tokenizer from the same header
    assert llm.model.config == load_config(gguf_path) and llm.engine is not None
    assert type(llm.model.layers[0].qkv).__name__ == "FusedWeight"  # Q4_K wq | wk, Q6_K wv
    assert llm.tokenizer.eos_ids == {len(_CHARS)}
    assert llm.tokenizer.encode("!#!!") == [0, 2, 93]
    [done] = llm.generate(["!#"], max_new_tokens=3, ignore_eos=True)
    assert len(done.token_ids) == 3


def test_an_open_checkpoint_answers_without_reading_again(gguf_path: Path,
                                                          count_reads: Callable[[Path], Reads]) -> None:
    reads = count_reads(gguf_path)
    with Checkpoint.open(gguf_path) as ckpt:
        assert ckpt.format == "gguf" and ckpt.default_dtype() == torch.float32
        footprint = ckpt.footprint(torch.float32)
        weights = ckpt.load("cpu")
        model = mistral_kernels.load_model(ckpt)
        tokenizer = load_tokenizer(ckpt)
    assert (reads.opens, reads.parses) == (1, 1)
    assert "Q4_K" in footprint.loaded and "Q6_K" in footprint.loaded and "Q4_K (tied head)" in footprint.loaded
    assert "lm_head" in weights and "layers.1.w13" in weights and model.config == ckpt.config
    assert tokenizer.encode("!") == [0]


def test_the_counters_see_a_second_read(gguf_path: Path, count_reads: Callable[[Path], Reads]) -> None:
    """The loaders before this package each read the path again: the counters show it."""
    reads = count_reads(gguf_path)
    with Checkpoint.open(gguf_path):
        load_tokenizer(gguf_path)  # a second reader of the same file
    assert reads.parses == 2 and reads.opens >= 2
    reads = count_reads(gguf_path)
    load_config(gguf_path)
    load_checkpoint(gguf_path)
    assert (reads.opens, reads.parses) == (2, 2)


def test_safetensors_shards_are_opened_once(tmp_path: Path, count_reads: Callable[[Path], Reads]) -> None:
    config = CONFIG.replace(tie_embeddings=False, rope_is_neox=True)
    write_random_checkpoint(config, tmp_path, "hf", torch.bfloat16, shards=2)
    shards = sorted(tmp_path.glob("*.safetensors"))
    assert len(shards) == 2
    counts = [count_reads(shard) for shard in shards]
    with Checkpoint.open(tmp_path) as ckpt:
        ckpt.footprint(torch.bfloat16)
        ckpt.load("cpu", torch.float32)  # converted: read through the descriptors
        ckpt.load("cpu")                 # stored dtype: memory maps of the same descriptors
    assert [c.opens for c in counts] == [1, 1]


def test_weights_outlive_the_checkpoint_and_a_closed_one_says_so(gguf_path: Path) -> None:
    with Checkpoint.open(gguf_path) as ckpt:
        weights = ckpt.load("cpu")
    # the packed blocks, mapped from the now closed file, are the file's bytes (read by the gguf package)
    stored = {t.name: t.data for t in gguf.GGUFReader(gguf_path).tensors}
    wq = torch.from_numpy(stored["blk.0.attn_q.weight"].copy()).view(torch.uint8).flatten()
    assert torch.equal(weights["layers.0.qkv"].parts[0].qweight.flatten()[:wq.numel()], wq)
    with pytest.raises(CheckpointError, match="closed; open it again"):
        ckpt.load("cpu")
