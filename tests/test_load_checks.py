"""What loading checks in the data (``checkpoint/finite.py``, ``checkpoint/tensor_io.py``): tensors sharing
bytes in a safetensors file, inf / NaN GGUF block scales on every path a block takes (packed, dequantized,
int8-requantized, the embedding), inf / NaN dense values wherever loading touches them (dtype conversion,
int8 quantization) and everywhere with ``check_tensors`` (``--check-tensors``).

References not written here: the ``safetensors`` library (refuses overlapping tensors), the ``gguf`` package
(decodes a block with a NaN / inf scale to non-finite values), and the logits of the unchecked load (NaN).
Bad files are written with safetensors' ``save_file`` / our streaming writer and ``gguf.GGUFWriter``.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from mistral_kernels import load_model
from mistral_kernels.checkpoint import CheckpointError, load_checkpoint
from mistral_kernels.checkpoint.finite import SCALE_BYTES
from mistral_kernels.checkpoint.gguf_header import read_gguf_header
from mistral_kernels.cli import main
from mistral_kernels.config import ModelConfig

from .helpers.random_checkpoints import write_random_checkpoint

gguf = pytest.importorskip("gguf")
from .helpers.quant_checkpoints import uniform, write_quant_gguf  # noqa: E402

Q = gguf.GGMLQuantizationType
SMALL = ModelConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=96, vocab_size=128,
                    max_position=256)
# K-quant rows must be whole 256-element super-blocks; untied, so token_embd is only the embedding
QUANT = ModelConfig(dim=256, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64, hidden_dim=256, vocab_size=256,
                    rope_is_neox=False, max_position=128, tie_embeddings=False)
IDS = torch.tensor([1, 5, 9, 13])
NAN16, INF16 = b"\xff\x7f", b"\x00\x7c"  # little-endian fp16 NaN and +inf


# ------------------------------------------------------------------------------ safetensors: shared bytes
def _hf_one_shard(tmp_path: Path) -> Path:
    path = tmp_path / "hf"
    write_random_checkpoint(SMALL, path, "hf", torch.float32)
    return path


def _edit_header(file: Path, edit) -> None:
    """Apply ``edit`` to a safetensors file's JSON header (same length kept by padding with spaces)."""
    data = file.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    edit(header)
    blob = json.dumps(header).encode()
    assert len(blob) <= n
    file.write_bytes(data[:8] + blob + b" " * (n - len(blob)) + data[8 + n:])


@pytest.mark.parametrize("shift", [0, 256])
def test_tensors_sharing_bytes_are_refused(tmp_path: Path, shift: int) -> None:
    """v_proj's data_offsets point at k_proj's bytes (the same ones, or half of them): the safetensors library
    refuses the file; we name the file and both tensors."""
    path = _hf_one_shard(tmp_path)
    file = path / "model.safetensors"
    k, v = "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight"

    def alias(header: dict) -> None:  # same shape, so the byte count stays right
        a, b = header[k]["data_offsets"]
        header[v]["data_offsets"] = [a + shift, b + shift]

    _edit_header(file, alias)
    with pytest.raises(Exception, match="(?i)offset"):  # the reference refuses it too
        with safe_open(str(file), "pt") as f:
            f.get_tensor(v)
    with pytest.raises(CheckpointError, match=rf"model\.safetensors: tensors .*{k}.* and .*{v}.* overlap"):
        load_model(path)


def test_adjacent_and_empty_tensors_are_not_overlaps(tmp_path: Path) -> None:
    """Back-to-back tensors and zero-byte ones at the same offset share no bytes."""
    from safetensors.torch import save_file

    from mistral_kernels.checkpoint.source import safetensors_source

    file = tmp_path / "t.safetensors"
    save_file({"a": torch.ones(4), "b": torch.zeros(0), "c": torch.zeros(0), "d": torch.ones(2)}, str(file))
    with safetensors_source([file]) as source:
        assert source.read("d").tolist() == [1.0, 1.0]


# ------------------------------------------------------------------------------ GGUF block scales
@pytest.mark.parametrize("kind", sorted(SCALE_BYTES))
def test_scale_table_matches_the_gguf_decoder(kind: str) -> None:
    """Every fp16 field of SCALE_BYTES is a scale: NaN / ±inf there makes the gguf package decode the block to
    non-finite values, and small finite scales decode finite."""
    block, size = gguf.GGML_QUANT_SIZES[Q[kind]]
    a, b = SCALE_BYTES[kind]
    rng = np.random.default_rng(0)
    for at in range(a, b, 2):
        for bad in (NAN16, INF16, b"\x00\xfc"):
            raw = rng.integers(0, 256, (1, size), dtype=np.uint8)
            for f in range(a, b, 2):
                raw[0, f:f + 2] = np.frombuffer(np.float16(1e-3).tobytes(), np.uint8)
            assert np.isfinite(gguf.quants.dequantize(raw.copy(), Q[kind])).all()
            raw[0, at:at + 2] = np.frombuffer(bad, np.uint8)
            with np.errstate(invalid="ignore", over="ignore"):
                assert not np.isfinite(gguf.quants.dequantize(raw, Q[kind])).all(), (kind, at, bad)


def _corrupt_block(path: Path, tensor: str, kind: str, block: int, bad: bytes = NAN16) -> None:
    size = gguf.GGML_QUANT_SIZES[Q[kind]][1]
    at = read_gguf_header(path).tensor_offsets[tensor] + size * block + SCALE_BYTES[kind][0]
    data = bytearray(path.read_bytes())
    data[at:at + 2] = bad
    path.write_bytes(bytes(data))


# (kind, tensor, load options): every path a block takes
PATHS = [
    ("Q4_0", "blk.1.ffn_up.weight", {"quantized": False}),        # --dequantize
    ("Q6_K", "blk.1.ffn_up.weight", {"quantized": False}),
    ("Q4_K", "blk.0.attn_k.weight", {"quantize": "int8"}),        # --quantize int8: decoded, then requantized
    ("Q8_0", "blk.1.ffn_down.weight", {"quantize": "int8"}),
    ("Q8_0", "token_embd.weight", {}),                            # default load: the embedding is dequantized
    ("Q5_0", "blk.0.ffn_gate.weight", {}),                        # no native kernel: dequantized by default
    ("Q5_1", "blk.0.attn_q.weight", {"quantize": "int8"}),
    ("Q4_1", "output.weight", {}),                                # packed (the check that existed)
]


@pytest.mark.parametrize(("kind", "tensor", "options"), PATHS)
def test_non_finite_block_scale_is_refused_on_every_path(tmp_path: Path, kind: str, tensor: str,
                                                         options: dict) -> None:
    path = tmp_path / "bad.gguf"
    write_quant_gguf(path, QUANT, uniform(kind))
    _corrupt_block(path, tensor, kind, block=3, bad=INF16 if "int8" in str(options) else NAN16)
    with pytest.raises(CheckpointError, match=rf"bad\.gguf: GGUF tensor '{tensor}' \({kind} .*block 3 .*"
                                              "non-finite scale"):
        load_checkpoint(path, dtype=torch.float32, **options)


def test_formats_without_a_plain_scale_are_checked_after_decoding(tmp_path: Path, monkeypatch) -> None:
    """A format missing from the scale table (as IQ1_M / MXFP4 are) is still refused: its decoded values are
    checked."""
    import mistral_kernels.checkpoint.finite as finite

    path = tmp_path / "bad.gguf"
    write_quant_gguf(path, QUANT, uniform("Q8_0"))
    _corrupt_block(path, "blk.0.attn_q.weight", "Q8_0", block=2)
    monkeypatch.setitem(finite.SCALE_BYTES, "Q8_0", None)
    monkeypatch.delitem(finite.SCALE_BYTES, "Q8_0")
    with pytest.raises(CheckpointError, match=r"tensor 'blk\.0\.attn_q\.weight' \(Q8_0 \[256, 256\]\) holds nan "
                                              r"at \[0, 64\]"):
        load_checkpoint(path, dtype=torch.float32, quantized=False)


# ------------------------------------------------------------------------------ dense values
def _poison(path: Path, name: str, where: tuple[int, int], value: float) -> None:
    """Set one element of a tensor of a one-file safetensors checkpoint (header untouched)."""
    file = path / "model.safetensors"
    data = bytearray(file.read_bytes())
    (n,) = struct.unpack("<Q", data[:8])
    spec = json.loads(data[8:8 + n])[name]
    assert spec["dtype"] == "F32"
    at = 8 + n + spec["data_offsets"][0] + 4 * (where[0] * spec["shape"][1] + where[1])
    data[at:at + 4] = struct.pack("<f", value)
    file.write_bytes(bytes(data))


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_dense_non_finite(tmp_path: Path, value: float) -> None:
    """fp32 file, one inf / NaN in wv: mapped as stored it loads (and gives NaN logits) unless check_tensors;
    converted to bf16 or quantized to int8 it is always refused — each naming the file and tensor."""
    path = _hf_one_shard(tmp_path)
    name = "model.layers.1.self_attn.v_proj.weight"
    _poison(path, name, (5, 7), value)
    unchecked = load_model(path, dtype=torch.float32)
    assert not unchecked.logits(IDS).isfinite().all()  # what loading it silently means
    msg = rf"model\.safetensors: tensor '{name}' .* holds {value} at \[5, 7\]"
    with pytest.raises(CheckpointError, match=msg):
        load_model(path, dtype=torch.float32, check_tensors=True)
    with pytest.raises(CheckpointError, match=msg):
        load_model(path, dtype=torch.bfloat16)
    with pytest.raises(CheckpointError, match=msg):
        load_model(path, dtype=torch.float32, quantize="int8")
    with pytest.raises(CheckpointError, match=msg):
        load_checkpoint(path, dtype=torch.float32, map_files=False, check_tensors=True)


def test_check_tensors_passes_finite_weights(tmp_path: Path) -> None:
    path = _hf_one_shard(tmp_path)
    a = load_model(path, dtype=torch.float32, check_tensors=True).logits(IDS)
    torch.testing.assert_close(a, load_model(path, dtype=torch.float32).logits(IDS), atol=0, rtol=0)


def test_gguf_f16_inf_is_refused_on_conversion(tmp_path: Path) -> None:
    """A GGUF F16 matrix holding +inf, loaded as fp32 (a conversion that touches every value)."""
    path = tmp_path / "f16.gguf"
    write_random_checkpoint(SMALL, path, "gguf", gguf_type="F16")
    offset = read_gguf_header(path).tensor_offsets["blk.0.ffn_down.weight"]
    data = bytearray(path.read_bytes())
    data[offset + 2 * 70:offset + 2 * 71] = INF16
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"tensor 'blk\.0\.ffn_down\.weight' \(F16 \[64, 96\]\) holds inf "
                                              r"at \[0, 70\]"):
        load_checkpoint(path, dtype=torch.float32)


def test_cli_check_tensors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``generate --check-tensors`` refuses the file in one line, exit 2; serve parses the flag too."""
    path = _hf_one_shard(tmp_path)
    _poison(path, "model.layers.0.mlp.up_proj.weight", (1, 2), math.nan)
    assert main(["generate", "--model", str(path), "--prompt", "x", "--dtype", "fp32", "--check-tensors"]) == 2
    err = capsys.readouterr().err
    assert "model.layers.0.mlp.up_proj.weight" in err and "holds nan at [1, 2]" in err
    from mistral_kernels.cli import build_parser

    assert build_parser().parse_args(["serve", "--check-tensors"]).check_tensors
