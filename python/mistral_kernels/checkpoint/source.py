"""A checkpoint's files, each opened once: what a path is (:class:`Probe`) and its tensors (:class:`TensorSource`).

:class:`Probe` opens a regular file once and reads its first bytes, so that formats can be detected by
content (docs/design.md §6) without opening the file again: the format that claims the file takes the
descriptor over (:meth:`Probe.take_fd`) and reads its header and data through it. :class:`TensorSource`
holds one descriptor per file (safetensors shards are opened once, header and data alike); memory maps
are made from those descriptors.
"""

from __future__ import annotations

import json
import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError
from .tensor_io import (Index, TensorInfo, map_packed, map_tensors, private_map, read_into, read_packed,
                        safetensors_tensors, selected_shape)

__all__ = ["Probe", "TensorSource", "open_fd", "read_json", "safetensors_source"]

MAGIC_BYTES = 8  # first bytes of a file read by the probe (GGUF's magic is 4)


def open_fd(path: Path) -> int:
    """A read-only descriptor of ``path``; CheckpointError naming it when it cannot be opened."""
    try:
        return os.open(path, os.O_RDONLY)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot open: {e}") from e


class Probe:
    """What ``path`` is, looked at once: a directory, or a regular file opened with its first bytes read.

    Formats decide from ``is_dir`` / ``magic`` (never from names). The format that reads the file takes the
    descriptor (:meth:`take_fd`); :meth:`close` closes it unless taken.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.is_dir = self.path.is_dir()
        self.is_file = not self.is_dir and self.path.is_file()
        self._fd: int | None = None
        self.magic = b""
        if self.is_file:
            self._fd = open_fd(self.path)
            try:
                self.magic = os.pread(self._fd, MAGIC_BYTES, 0)
            except OSError as e:
                self.close()
                raise CheckpointError(f"{self.path}: cannot read: {e}") from e

    def take_fd(self) -> int:
        """The open descriptor of the file, now owned by the caller."""
        if self._fd is None:
            raise ValueError(f"Probe.take_fd: {self.path} is not an open file")
        fd, self._fd = self._fd, None
        return fd

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@dataclass
class TensorSource:
    """The tensors of a checkpoint under the file's own names (headers validated; no data read yet).

    ``read_into(name, out, index=None)`` fills ``out`` with the tensor (or the part ``index`` selects) in
    ``out``'s dtype and device; ``read(name, index=None)`` returns a new tensor of the stored dtype (fp32 for
    GGUF quantized types); ``map(names, dtype)`` views tensors stored back to back in ``dtype`` through a
    private memory map (:func:`mistral_kernels.checkpoint.tensor_io.map_tensors`), or gives None;
    ``map_packed(names)`` / ``read_packed(name, out)`` give GGUF quantized tensors' stored blocks as bytes.
    ``fds`` are the files' descriptors, opened once (by :class:`Probe` or :func:`safetensors_source`) and
    closed by :meth:`close` (maps live on in the tensors viewing them).
    """

    tensors: dict[str, TensorInfo]
    fds: dict[Path, int] = field(default_factory=dict)
    _maps: dict[Path, mmap.mmap] = field(default_factory=dict)
    _closed: bool = False

    def map(self, names: list[str], dtype: torch.dtype) -> torch.Tensor | None:
        try:
            return map_tensors([self.tensors[n] for n in names], dtype, self._map_of)
        except OSError as e:
            raise CheckpointError(f"{self.tensors[names[0]].file}: cannot map: {e}") from e

    def map_packed(self, names: list[str]) -> torch.Tensor | None:
        try:
            return map_packed([self.tensors[n] for n in names], self._map_of)
        except OSError as e:
            raise CheckpointError(f"{self.tensors[names[0]].file}: cannot map: {e}") from e

    def read_packed(self, name: str, out: torch.Tensor) -> None:
        read_packed(self._fd(self.tensors[name].file), self.tensors[name], out)

    def _fd(self, file: Path) -> int:
        if self._closed:
            raise CheckpointError(f"{file}: the checkpoint is closed; open it again to read tensors")
        fd = self.fds.get(file)
        if fd is None:  # a source built from infos alone (tests): open on first use, once
            fd = self.fds[file] = open_fd(file)
        return fd

    def _map_of(self, file: Path) -> mmap.mmap:
        m = self._maps.get(file)
        if m is None:
            m = self._maps[file] = private_map(self._fd(file))
        return m

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: t.shape for name, t in self.tensors.items()}

    def read_into(self, name: str, out: torch.Tensor, index: Index | None = None) -> None:
        info = self.tensors[name]
        read_into(self._fd(info.file), info, out, index)

    def read(self, name: str, index: Index | None = None) -> torch.Tensor:
        info = self.tensors[name]
        out = torch.empty(selected_shape(info.shape, index), dtype=info.dtype)
        self.read_into(name, out, index)
        return out

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()
        self._maps.clear()  # dropped, not closed: the weights viewing a map keep it
        self._closed = True

    def __enter__(self) -> TensorSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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


def safetensors_source(files: list[Path]) -> TensorSource:
    """The tensors of safetensors shards, each file opened once (header and data through one descriptor).

    Raises
    ------
    CheckpointError
        A shard is missing or its header corrupt, or the same tensor name appears in two shards.
    """
    source = TensorSource({})
    try:
        for file in files:
            if not file.is_file():
                raise CheckpointError(f"safetensors shard {file} is missing")
            fd = source.fds[file] = open_fd(file)
            for name, info in safetensors_tensors(fd, file).items():
                if name in source.tensors:
                    raise CheckpointError(f"tensor {name!r} is in two shards: {source.tensors[name].file.name} and "
                                          f"{file.name}")
                source.tensors[name] = info
    except BaseException:
        source.close()
        raise
    return source
