"""Default dtype = the checkpoint's own (like transformers' ``dtype="auto"``), ``--dtype`` / ``dtype=``
overrides it, and the loaded (fused) weights equal what the reference readers (the ``safetensors`` and
``gguf`` packages) read from the same files. Also: the RoPE table is built lazily.

Shape letters: H hidden, Hq / Hkv heads, D head_dim, I intermediate, V vocab.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from mistral_kernels import load_model
from mistral_kernels.cli import main
from mistral_kernels.config import ModelConfig
from mistral_kernels.memory import memory_warning
from mistral_kernels.checkpoint import Checkpoint, load_checkpoint

from .helpers.random_checkpoints import write_random_checkpoint

gguf = pytest.importorskip("gguf")
CONFIG = ModelConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=96, vocab_size=128,
                     max_position=1 << 20)


@pytest.mark.parametrize("stored,expected", [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32),
                                             (torch.float16, torch.bfloat16)])  # CPU kernels: fp32, bf16
@pytest.mark.parametrize("fmt", ["hf", "consolidated"])
def test_default_dtype_follows_the_checkpoint(tmp_path: Path, fmt: str, stored: torch.dtype,
                                              expected: torch.dtype) -> None:
    write_random_checkpoint(CONFIG, tmp_path, fmt, stored, shards=2)
    model = load_model(tmp_path)
    assert model.dtype == expected and model.embed.dtype == expected and model.layers[0].qkv.dtype == expected
    assert load_model(tmp_path, dtype=torch.float32).dtype == torch.float32  # explicit dtype wins


def test_hf_config_dtype_wins_over_the_stored_one(tmp_path: Path) -> None:
    """transformers' rule: config.json's ``dtype`` (v5) / ``torch_dtype`` (v4), else the tensors' dtype."""
    write_random_checkpoint(CONFIG, tmp_path, "hf", torch.bfloat16)
    cfg = json.loads((tmp_path / "config.json").read_text())
    for key, value, want in (("dtype", "float32", torch.float32), ("torch_dtype", "float32", torch.float32),
                             ("torch_dtype", None, torch.bfloat16)):
        cfg.pop("torch_dtype", None)
        cfg.pop("dtype", None)
        cfg[key] = value
        (tmp_path / "config.json").write_text(json.dumps(cfg))
        with Checkpoint.open(tmp_path) as ckpt:
            assert ckpt.default_dtype() == want, (key, value)
    with Checkpoint.open(tmp_path) as ckpt:
        assert ckpt.default_dtype("cuda") == torch.bfloat16


@pytest.mark.parametrize("kind,expected", [("F16", torch.bfloat16), ("BF16", torch.bfloat16), ("F32", torch.float32),
                                           ("Q8_0", torch.float32)])
def test_gguf_default_dtype_and_values(tmp_path: Path, kind: str, expected: torch.dtype) -> None:
    """GGUF: the type of most weights (quantized → fp32); values equal gguf's own dequantization (dequantized
    at load with ``quantized=False``, and, by default, the packed blocks kept decode to them)."""
    path = tmp_path / "m.gguf"
    write_random_checkpoint(CONFIG, path, "gguf", gguf_type=kind)
    config, weights = load_checkpoint(path, quantized=False)
    assert weights["embed"].dtype == expected
    reader = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}

    def reference(name: str) -> torch.Tensor:
        t = reader[name]
        values = gguf.quants.dequantize(t.data, t.tensor_type)
        return torch.from_numpy(np.array(values, dtype=np.float32)).reshape(tuple(reversed(t.shape.tolist())))

    qkv = torch.cat([reference(f"blk.1.attn_{x}.weight") for x in "qkv"])
    torch.testing.assert_close(weights["layers.1.qkv"].float(), qkv.to(expected).float(), atol=0, rtol=0)
    w13 = torch.cat([reference("blk.0.ffn_gate.weight"), reference("blk.0.ffn_up.weight")])
    torch.testing.assert_close(weights["layers.0.w13"].float(), w13.to(expected).float(), atol=0, rtol=0)
    if kind == "Q8_0":
        _, packed = load_checkpoint(path)
        torch.testing.assert_close(packed["layers.1.qkv"].dequantize(), qkv, atol=0, rtol=0)
        torch.testing.assert_close(packed["layers.0.w13"].dequantize(), w13, atol=0, rtol=0)


def test_fused_weights_equal_the_safetensors_reader(tmp_path: Path) -> None:
    """Sharded HF bf16 read as fp32 (conversion path) and bf16 (direct path) vs safetensors' load_file."""
    write_random_checkpoint(CONFIG, tmp_path, "hf", torch.bfloat16, shards=3)
    ref: dict[str, torch.Tensor] = {}
    for f in sorted(tmp_path.glob("*.safetensors")):
        ref |= load_file(str(f))
    p = "model.layers.1."
    qkv = torch.cat([ref[p + f"self_attn.{x}_proj.weight"] for x in "qkv"])
    w13 = torch.cat([ref[p + "mlp.gate_proj.weight"], ref[p + "mlp.up_proj.weight"]])
    for dtype in (torch.bfloat16, torch.float32):
        _, w = load_checkpoint(tmp_path, dtype=dtype)
        assert torch.equal(w["layers.1.qkv"], qkv.to(dtype)) and torch.equal(w["layers.1.w13"], w13.to(dtype))
        assert torch.equal(w["lm_head"], ref["lm_head.weight"].to(dtype))


def test_cli_dtype_default_and_override(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_random_checkpoint(CONFIG, tmp_path, "hf", torch.bfloat16)
    assert main(["info", "--model", str(tmp_path)]) == 0
    assert "GiB in bfloat16" in capsys.readouterr().out
    assert main(["info", "--model", str(tmp_path), "--dtype", "fp32"]) == 0
    assert "GiB in float32" in capsys.readouterr().out


def test_rope_table_is_built_lazily(tmp_path: Path) -> None:
    """max_position 2^20 (Nemo declares 1,024,000): loading builds no table; a step builds only the rows its
    block tables can reach (not 2^20 × R fp32 = 64 MiB here, 512 MiB at R = 128)."""
    write_random_checkpoint(CONFIG, tmp_path, "hf", torch.float32)
    model = load_model(tmp_path)
    assert model.rope.table.shape[0] == 0
    model.logits(torch.arange(20))
    assert 20 <= model.rope.table.shape[0] <= 4096


def test_memory_warning_numbers() -> None:
    """Weights (7.24B × 4 bytes) + KV cache (32768 × 256 KiB) vs what is available: sizes and flags to change."""
    config = ModelConfig.mistral_7b_v01()
    assert memory_warning(config, torch.bfloat16, "cpu", 4096, available=64 << 30) is None
    message = memory_warning(config, torch.float32, "cpu", 32768, available=24 << 30)
    assert message is not None
    for needle in ("27.0 GiB of weights", "8.0 GiB of KV cache", "24.0 GiB", "--dtype bf16", "--num-blocks"):
        assert needle in message, (needle, message)


def test_llm_warns_before_loading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The warning comes before the weights are read (here the tokenizer is missing, so loading fails after)."""
    import mistral_kernels.llm as llm_module
    from mistral_kernels.memory import MemoryWarning

    write_random_checkpoint(CONFIG, tmp_path, "hf", torch.bfloat16)
    monkeypatch.setattr(llm_module, "memory_warning",
                        lambda *args, **kw: memory_warning(*args, **kw, available=1 << 20))
    with pytest.warns(MemoryWarning, match=r"GiB of weights .* but only 0\.0 GiB of cpu memory"), \
            pytest.raises(FileNotFoundError, match="tokenizer"):
        llm_module.LLM(tmp_path)
    assert main(["generate", "--model", str(tmp_path), "--prompt", "x"]) == 2  # the CLI: one warning line
    err = capsys.readouterr().err
    assert "mistral-kernels: warning: the model needs" in err and "cannot load the model" in err
