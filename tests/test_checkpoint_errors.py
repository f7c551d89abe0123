"""Bad checkpoints are clear ``CheckpointError``s naming the file, never a crash, a
raw library error or a multi-GB allocation: each defect found by the issue as a regression test, then a
seeded fuzz run (truncations, header byte edits, huge / null / negative fields) over all three formats in a
subprocess (a crash there fails the test instead of killing pytest).
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from mistral_kernels import load_model
from mistral_kernels.checkpoint import load_config
from mistral_kernels.config import ModelConfig
from mistral_kernels.errors import CheckpointError

from .helpers.random_checkpoints import write_random_checkpoint

CONFIG = ModelConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=96, vocab_size=128,
                     max_position=256)


def _hf(tmp_path: Path, **changes: object) -> Path:
    path = tmp_path / "hf"
    write_random_checkpoint(CONFIG, path, "hf", torch.float32, shards=2)
    if changes:
        cfg = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps({**cfg, **changes}))
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


# ------------------------------------------------------------------------------------------ item 7
def test_integer_weights_are_rejected(tmp_path: Path) -> None:
    path = _hf(tmp_path)
    shard = sorted(path.glob("model-*.safetensors"))[0]

    def flip(header: dict) -> None:  # F32 → I32: same size, so only the dtype tells
        header["model.embed_tokens.weight"]["dtype"] = "I32"

    _edit_header(shard, flip)
    with pytest.raises(CheckpointError, match=r"not floating-point.*model\.embed_tokens\.weight \(I32\)"):
        load_model(path)


def test_int64_tensor_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "c"
    write_random_checkpoint(CONFIG, path, "consolidated", torch.float32)
    from safetensors.torch import load_file

    tensors = load_file(str(path / "consolidated.safetensors"))
    tensors["norm.weight"] = torch.ones(CONFIG.dim, dtype=torch.int64)
    save_file(tensors, str(path / "consolidated.safetensors"))
    with pytest.raises(CheckpointError, match=r"norm\.weight \(I64\)"):
        load_model(path)


def test_same_tensor_in_two_shards(tmp_path: Path) -> None:
    path = _hf(tmp_path)
    save_file({"model.norm.weight": torch.ones(CONFIG.dim)}, str(path / "extra.safetensors"))
    index = json.loads((path / "model.safetensors.index.json").read_text())
    index["weight_map"]["extra"] = "extra.safetensors"
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="'model.norm.weight' is in two shards"):
        load_model(path)


def test_index_paths_stay_inside_the_checkpoint(tmp_path: Path) -> None:
    path = _hf(tmp_path)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.norm.weight"] = "../../../etc/passwd"
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="outside the checkpoint directory"):
        load_model(path)


@pytest.mark.parametrize("eps", [0, -1e-5, float("nan")])
def test_rms_norm_eps_must_be_positive(tmp_path: Path, eps: float) -> None:
    with pytest.raises(CheckpointError, match=r"config\.json: rms_norm_eps="):
        load_config(_hf(tmp_path, rms_norm_eps=eps))


def _gguf_field_pos(data: bytes, name: bytes) -> int:
    """Byte position just after a GGUF tensor info's name (its u32 n_dims)."""
    pos = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    return pos


def test_gguf_type_that_does_not_match_the_data(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    write_random_checkpoint(CONFIG, path, "gguf", gguf_type="F32")
    data = bytearray(path.read_bytes())
    pos = _gguf_field_pos(data, b"blk.0.attn_q.weight")
    n_dims = struct.unpack_from("<I", data, pos)[0]
    struct.pack_into("<I", data, pos + 4 + 8 * n_dims, 1)  # F32 → F16: half the bytes
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"blk\.0\.attn_q\.weight.*does not match its data"):
        load_model(path)


def test_gguf_misaligned_offset(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    write_random_checkpoint(CONFIG, path, "gguf", gguf_type="F16")
    data = bytearray(path.read_bytes())
    pos = _gguf_field_pos(data, b"blk.1.ffn_up.weight")
    n_dims = struct.unpack_from("<I", data, pos)[0]
    at = pos + 4 + 8 * n_dims + 4
    struct.pack_into("<Q", data, at, struct.unpack_from("<Q", data, at)[0] + 2)
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"blk\.1\.ffn_up\.weight.*not a multiple of the alignment"):
        load_model(path)


# ------------------------------------------------------------------------------------------ items 2 and 8
@pytest.mark.parametrize("field,value", [("num_hidden_layers", 10**8), ("max_position_embeddings", 10**9),
                                         ("num_attention_heads", None), ("num_attention_heads", 0),
                                         ("hidden_size", "4096"), ("vocab_size", -1), ("intermediate_size", 2**62)])
def test_config_fields_are_bounded(tmp_path: Path, field: str, value: object) -> None:
    path = _hf(tmp_path, **{field: value})
    with pytest.raises(CheckpointError, match=rf"{path / 'config.json'}: .*{field}"):
        load_model(path)


def test_unreadable_files_name_the_file(tmp_path: Path) -> None:
    path = _hf(tmp_path)
    (path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"config\.json: not a readable JSON file"):
        load_model(path)
    path = _hf(tmp_path / "b")
    shard = sorted(path.glob("model-*.safetensors"))[1]
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(CheckpointError, match=shard.name):
        load_model(path)
    with pytest.raises(CheckpointError, match="not a regular file or a directory"):
        load_model("/dev/zero")


# ------------------------------------------------------------------------------------------ fuzz
FUZZ = r"""
import json, os, random, shutil, struct, sys, traceback
from pathlib import Path
from mistral_kernels import load_model
from mistral_kernels.errors import CheckpointError

root, seed, per_format = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
HUGE = [10**9, 2**63, -1, 0, None, "x", 1e308, True, [], {}, 2**31]

def files_of(path):
    return sorted(path.iterdir()) if path.is_dir() else [path]

def header_len(file):
    data = file.read_bytes()
    if data[:4] == b"GGUF":
        return min(len(data), 4096)
    return min(len(data), 8 + struct.unpack("<Q", data[:8])[0]) if len(data) >= 8 else len(data)

def mutate(path):
    kind = rng.choice(["truncate", "byte", "field", "huge_number"])
    file = rng.choice([f for f in files_of(path) if f.suffix in (".json", ".safetensors", ".gguf")])
    data = bytearray(file.read_bytes())
    if kind == "truncate":
        data = data[:rng.randrange(len(data))]
    elif kind == "byte":
        end = header_len(file) if file.suffix != ".json" else len(data)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(max(1, end))] = rng.randrange(256)
    elif kind == "field" and file.suffix == ".json":
        obj = json.loads(data)
        key = rng.choice(sorted(obj))
        obj[key] = rng.choice(HUGE)
        data = bytearray(json.dumps(obj).encode())
    else:  # a number in a header made huge: a JSON digit run, or a GGUF u32/u64 after a key
        end = header_len(file)
        spots = [i for i in range(8, end - 8) if 48 <= data[i] <= 57] if file.suffix != ".gguf" else \
            list(range(24, end - 8))
        if spots:
            i = rng.choice(spots)
            data[i:i + 1] = b"99999999999" if file.suffix != ".gguf" else bytes([0xFF] * 4)
    file.write_bytes(bytes(data))
    return f"{kind} {file.name}"

summary = {}
for pristine in sorted(root.iterdir()):
    counts = {"ok": 0, "CheckpointError": 0, "other": []}
    for n in range(per_format):
        case = root.parent / "case" / pristine.name
        shutil.rmtree(root.parent / "case", ignore_errors=True)
        case.parent.mkdir()
        (shutil.copytree if pristine.is_dir() else shutil.copy)(pristine, case)
        what = mutate(case)
        try:
            load_model(case)
            counts["ok"] += 1
        except CheckpointError as e:
            names = {case.name, *(f.name for f in files_of(case))}
            if not any(name in str(e) for name in names):
                counts["other"].append(f"{what}: no file named in {e}")
            else:
                counts["CheckpointError"] += 1
        except Exception as e:
            counts["other"].append(f"{what}: {type(e).__name__}: {e} " + traceback.format_exc()[-600:])
    summary[pristine.name] = counts
print(json.dumps(summary))
"""


def test_fuzzed_checkpoints_raise_checkpoint_errors(tmp_path: Path) -> None:
    root = tmp_path / "pristine"
    root.mkdir()
    write_random_checkpoint(CONFIG, root / "hf", "hf", torch.float32, shards=2)
    write_random_checkpoint(CONFIG, root / "consolidated", "consolidated", torch.bfloat16)
    write_random_checkpoint(CONFIG, root / "model.gguf", "gguf", gguf_type="Q8_0")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-c", FUZZ, str(root), "1234", "60"], capture_output=True, text=True,
                         env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    for name, counts in summary.items():
        assert not counts["other"], (name, counts["other"][:5])
        assert counts["CheckpointError"] >= 20, (name, counts)  # the mutations do break files
