"""Checkpoint formats: which one a path holds, its files, and a reader over its tensors.

The format is decided by what the path contains (docs/design.md §6), never by model-family names:

==================  =============================================  ===========
format              detected by                                    config
==================  =============================================  ===========
``hf``              directory with ``config.json`` + safetensors   config.json
``consolidated``    directory with ``params.json`` +               params.json
                    ``consolidated*.safetensors``
``gguf``            file starting with the bytes ``GGUF``          metadata
==================  =============================================  ===========

:func:`mistral_kernels.config.load_config` reads the config of each format; :func:`open_tensors` gives the
tensors under the file's own names (renaming and fusing happen in :mod:`mistral_kernels.weights`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .gguf_metadata import read_gguf_header

__all__ = ["FORMATS", "CheckpointError", "TensorSource", "detect_format", "open_tensors", "read_json"]

FORMATS = ("hf", "consolidated", "gguf")
Index = tuple[slice, ...]  # one slice per dim: the part of a tensor to read (tensor-parallel shards)


class CheckpointError(ValueError):
    """The checkpoint cannot be loaded: unknown format, or tensors missing / unexpected / mis-shaped."""


@dataclass
class TensorSource:
    """The tensors of a checkpoint: name → shape (known without reading data), and a reader
    ``read(name, index=None)`` returning fp32 or native-dtype tensors (``index``: read only that part).
    ``closers`` must be closed when done (open file handles)."""

    shapes: dict[str, tuple[int, ...]]
    read: Callable[..., torch.Tensor]
    closers: list[contextlib.AbstractContextManager] = field(default_factory=list)


def detect_format(path: str | Path) -> str:
    """``"hf"``, ``"consolidated"`` or ``"gguf"`` from what ``path`` contains (see module docstring).

    Raises
    ------
    CheckpointError
        The path does not exist, or holds none of the formats (the message lists what it found).
    """
    p = Path(path)
    if p.is_file():
        with p.open("rb") as f:
            if f.read(4) == b"GGUF":
                return "gguf"
        raise CheckpointError(f"{p} is a file but not a GGUF file (no 'GGUF' magic); pass a .gguf file or a "
                              "checkpoint directory")
    if not p.is_dir():
        raise CheckpointError(f"checkpoint path {p} does not exist")
    if (p / "config.json").is_file() and _hf_files(p):
        return "hf"
    if (p / "params.json").is_file() and _consolidated_files(p):
        return "consolidated"
    raise CheckpointError(
        f"{p}: not a checkpoint directory — expected config.json + *.safetensors (HF) or params.json + "
        f"consolidated*.safetensors (Mistral); found {sorted(q.name for q in p.iterdir())[:20]}")


def read_json(path: Path) -> dict[str, Any]:
    """A JSON file's object (config.json, params.json)."""
    return json.loads(path.read_text())


def open_tensors(path: str | Path, fmt: str) -> TensorSource:
    """The tensors of the checkpoint at ``path`` in format ``fmt`` (from :func:`detect_format`)."""
    p = Path(path)
    if fmt == "hf":
        return _safetensors_source(_hf_files(p))
    if fmt == "consolidated":
        return _safetensors_source(_consolidated_files(p))
    if fmt == "gguf":
        return _gguf_source(p)
    raise ValueError(f"open_tensors: fmt must be one of {FORMATS}, got {fmt!r}")


def _hf_files(p: Path) -> list[Path]:
    index = p / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index)["weight_map"]
        return [p / f for f in sorted(set(weight_map.values()))]
    return [f for f in sorted(p.glob("*.safetensors")) if not f.name.startswith("consolidated")]


def _consolidated_files(p: Path) -> list[Path]:
    return sorted(p.glob("consolidated*.safetensors"))


def _safetensors_source(files: list[Path]) -> TensorSource:
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    handles: dict[str, Any] = {}
    closers: list[contextlib.AbstractContextManager] = []
    for file in files:
        if not file.is_file():
            raise CheckpointError(f"safetensors shard {file} is missing")
        handle = safe_open(str(file), framework="pt")  # memory-mapped
        closers.append(handle)
        for name in handle.keys():
            shapes[name] = tuple(handle.get_slice(name).get_shape())
            handles[name] = handle

    def read(name: str, index: Index | None = None) -> torch.Tensor:
        if index is None:
            return handles[name].get_tensor(name)
        return handles[name].get_slice(name)[index]  # reads only the selected bytes

    return TensorSource(shapes, read, closers)


def _gguf_source(path: Path) -> TensorSource:
    """Shapes from the fast header reader; ``gguf.GGUFReader`` is built on the first tensor read."""
    shapes = read_gguf_header(path).tensor_shapes
    tensors: dict[str, Any] = {}

    def read(name: str, index: Index | None = None) -> torch.Tensor:
        import gguf

        if index is not None:  # GGUF: dequantize the whole tensor, keep the shard
            return read(name)[index].clone()
        if not tensors:
            tensors.update((t.name, t) for t in gguf.GGUFReader(str(path)).tensors)
        t = tensors[name]
        try:
            array = gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError as exc:
            raise CheckpointError(f"{path}: tensor {name} has type {t.tensor_type.name}, which the gguf package "
                                  "cannot dequantize") from exc
        return torch.from_numpy(np.array(array, dtype=np.float32).reshape(shapes[name]))

    return TensorSource(shapes, read)
