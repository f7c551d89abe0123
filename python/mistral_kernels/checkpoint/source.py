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

import json
import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .errors import CheckpointError
from .gguf_metadata import read_gguf_header
from .tensor_io import (Index, TensorInfo, gguf_tensors, map_packed, map_tensors, read_into, read_packed,
                        safetensors_tensors, selected_shape)

__all__ = ["FORMATS", "CheckpointError", "Index", "TensorInfo", "TensorSource", "detect_format", "open_tensors",
           "read_json"]

FORMATS = ("hf", "consolidated", "gguf")


@dataclass
class TensorSource:
    """The tensors of a checkpoint under the file's own names (headers validated; no data read yet).

    ``read_into(name, out, index=None)`` fills ``out`` with the tensor (or the part ``index`` selects) in
    ``out``'s dtype and device; ``read(name, index=None)`` returns a new tensor of the stored dtype (fp32 for
    GGUF quantized types); ``map(names, dtype)`` views tensors stored back to back in ``dtype`` through a
    private memory map (:func:`mistral_kernels.tensor_io.map_tensors`), or gives None; ``map_packed(names)`` /
    ``read_packed(name, out)`` give GGUF quantized tensors' stored blocks as bytes. Use as a context
    manager, or call :meth:`close`: it holds the files open (maps live on in the tensors viewing them).
    """

    tensors: dict[str, TensorInfo]
    _fds: dict[Path, int] = field(default_factory=dict)
    _maps: dict[Path, mmap.mmap] = field(default_factory=dict)

    def map(self, names: list[str], dtype: torch.dtype) -> torch.Tensor | None:
        try:
            return map_tensors([self.tensors[n] for n in names], dtype, self._maps)
        except OSError as e:
            raise CheckpointError(f"{self.tensors[names[0]].file}: cannot map: {e}") from e

    def map_packed(self, names: list[str]) -> torch.Tensor | None:
        try:
            return map_packed([self.tensors[n] for n in names], self._maps)
        except OSError as e:
            raise CheckpointError(f"{self.tensors[names[0]].file}: cannot map: {e}") from e

    def read_packed(self, name: str, out: torch.Tensor) -> None:
        read_packed(self._fd(self.tensors[name]), self.tensors[name], out)

    def _fd(self, info: TensorInfo) -> int:
        fd = self._fds.get(info.file)
        if fd is None:
            try:
                fd = self._fds[info.file] = os.open(info.file, os.O_RDONLY)
            except OSError as e:
                raise CheckpointError(f"{info.file}: cannot open: {e}") from e
        return fd

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: t.shape for name, t in self.tensors.items()}

    def read_into(self, name: str, out: torch.Tensor, index: Index | None = None) -> None:
        info = self.tensors[name]
        read_into(self._fd(info), info, out, index)

    def read(self, name: str, index: Index | None = None) -> torch.Tensor:
        info = self.tensors[name]
        out = torch.empty(selected_shape(info.shape, index), dtype=info.dtype)
        self.read_into(name, out, index)
        return out

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._maps.clear()  # dropped, not closed: the weights viewing a map keep it

    def __enter__(self) -> TensorSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def detect_format(path: str | Path) -> str:
    """``"hf"``, ``"consolidated"`` or ``"gguf"`` from what ``path`` contains (see module docstring).

    Raises
    ------
    CheckpointError
        The path does not exist, is not a regular file or directory, or holds none of the formats (the
        message lists what it found).
    """
    p = Path(path)
    if p.is_file():
        try:
            with p.open("rb") as f:
                magic = f.read(4)
        except OSError as e:
            raise CheckpointError(f"{p}: cannot read: {e}") from e
        if magic == b"GGUF":
            return "gguf"
        raise CheckpointError(f"{p} is a file but not a GGUF file (no 'GGUF' magic); pass a .gguf file or a "
                              "checkpoint directory")
    if not p.is_dir():
        if p.exists():
            raise CheckpointError(f"checkpoint path {p} is not a regular file or a directory")
        raise CheckpointError(f"checkpoint path {p} does not exist")
    if (p / "config.json").is_file() and _hf_files(p):
        return "hf"
    if (p / "params.json").is_file() and _consolidated_files(p):
        return "consolidated"
    raise CheckpointError(
        f"{p}: not a checkpoint directory — expected config.json + *.safetensors (HF) or params.json + "
        f"consolidated*.safetensors (Mistral); found {sorted(q.name for q in p.iterdir())[:20]}")


def read_json(path: Path) -> dict[str, Any]:
    """A JSON file's object (config.json, params.json, the shard index).

    Raises
    ------
    CheckpointError
        The file cannot be read, is not UTF-8 JSON, or does not hold an object (the message names the file).
    """
    try:
        value = json.loads(path.read_bytes())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise CheckpointError(f"{path}: not a readable JSON file ({type(e).__name__}: {e})") from e
    if not isinstance(value, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def open_tensors(path: str | Path, fmt: str) -> TensorSource:
    """The tensors of the checkpoint at ``path`` in format ``fmt`` (from :func:`detect_format`).

    Raises
    ------
    CheckpointError
        A header is corrupt (see :mod:`mistral_kernels.tensor_io`), a shard is missing, or the same tensor
        name appears in two shards.
    """
    p = Path(path)
    if fmt == "hf":
        return _safetensors_source(_hf_files(p))
    if fmt == "consolidated":
        return _safetensors_source(_consolidated_files(p))
    if fmt == "gguf":
        return TensorSource(gguf_tensors(p, read_gguf_header(p)))
    raise ValueError(f"open_tensors: fmt must be one of {FORMATS}, got {fmt!r}")


def _hf_files(p: Path) -> list[Path]:
    """The safetensors files of an HF directory: those the index names (inside the directory), else all."""
    index = p / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
            raise CheckpointError(f"{index}: 'weight_map' must be an object of tensor name → file name")
        files = []
        for name in sorted(set(weight_map.values())):
            parts = Path(os.path.normpath(name)).parts  # lexical: shards may be symlinks (the HF hub cache)
            if not parts or Path(name).is_absolute() or parts[0] == "..":
                raise CheckpointError(f"{index}: weight_map file {name!r} is outside the checkpoint directory {p}")
            files.append(p / name)
        return files
    return [f for f in sorted(p.glob("*.safetensors")) if not f.name.startswith("consolidated")]


def _consolidated_files(p: Path) -> list[Path]:
    return sorted(p.glob("consolidated*.safetensors"))


def _safetensors_source(files: list[Path]) -> TensorSource:
    tensors: dict[str, TensorInfo] = {}
    for file in files:
        if not file.is_file():
            raise CheckpointError(f"safetensors shard {file} is missing")
        for name, info in safetensors_tensors(file).items():
            if name in tensors:
                raise CheckpointError(f"tensor {name!r} is in two shards: {tensors[name].file.name} and {file.name}")
            tensors[name] = info
    return TensorSource(tensors)
