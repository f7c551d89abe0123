"""Fast reader of a GGUF file's header: key/value metadata and tensor infos (not the tensor data).

`gguf.GGUFReader` builds numpy views for every element of every array (≈4 s for a 49k-token vocabulary);
this parses the header with `struct` in a fraction of that. The model config
(:func:`mistral_kernels.checkpoint.gguf.config_from_metadata`), the tokenizer and the checkpoint's tensor
infos all come from one parse (:class:`mistral_kernels.checkpoint.Checkpoint` keeps it); ``GGUFReader`` is never
built. Layout (GGUF v2/v3, little endian)::

    "GGUF" u32 version  u64 n_tensors  u64 n_kv
    n_kv × ( string key, u32 type, value )      string = u64 length + UTF-8 bytes
    array value = u32 element type, u64 count, count × element
    n_tensors × ( string name, u32 n_dims, n_dims × u64 dim, u32 ggml type, u64 offset )
    padding to ``general.alignment`` (32 when absent), then the tensor data; each offset is relative to the
    start of the data and a multiple of the alignment

Tensor dims are listed innermost first (ggml order): a [V, H] embedding is stored as dims (H, V).
Anything malformed (truncation, counts or lengths past the end of the file, more than 4 dims, duplicate
tensor names, a bad alignment) raises :class:`~mistral_kernels.errors.CheckpointError` naming the file.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import CheckpointError

__all__ = ["GGUF_MAGIC", "GGUFHeader", "read_gguf_header", "read_gguf_header_fd", "read_gguf_metadata"]

GGUF_MAGIC = b"GGUF"

# GGUF value type -> struct format (scalars); 8 = string, 9 = array
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GGUFHeader:
    """What a GGUF file says before its tensor data.

    Attributes
    ----------
    metadata : key → value (arrays as Python lists), e.g. ``{"general.architecture": "llama", ...}``
    tensor_shapes : tensor name → shape in PyTorch order (outermost first; ggml's dims reversed)
    tensor_types : tensor name → ggml type id (``gguf.GGMLQuantizationType``)
    tensor_offsets : tensor name → absolute byte offset of its data in the file
    alignment : ``general.alignment`` (32 when absent)
    """

    metadata: dict[str, Any]
    tensor_shapes: dict[str, tuple[int, ...]]
    tensor_types: dict[str, int] = field(default_factory=dict)
    tensor_offsets: dict[str, int] = field(default_factory=dict)
    alignment: int = 32


class _Cursor:
    def __init__(self, data: bytes, pos: int) -> None:
        self.data = data
        self.pos = pos

    def take(self, fmt: str) -> Any:
        value = struct.unpack_from(fmt, self.data, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.take("<Q")
        if self.pos + n > len(self.data):
            raise IndexError("string runs past the bytes read")
        s = self.data[self.pos:self.pos + n].decode("utf-8", errors="replace")
        self.pos += n
        return s

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.take(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            inner = self.take("<I")
            count = self.take("<Q")
            smallest = struct.calcsize(_SCALARS[inner]) if inner in _SCALARS else 8  # bytes per element, at least
            if count * smallest > len(self.data) - self.pos:
                raise IndexError("array runs past the bytes read")
            if inner in _SCALARS:
                fmt = _SCALARS[inner]
                size = struct.calcsize(fmt)
                values = list(struct.unpack_from(f"<{count}{fmt[1]}", self.data, self.pos))
                self.pos += size * count
                return values
            return [self.value(inner) for _ in range(count)]
        raise ValueError(f"GGUF metadata: unknown value type {kind} at byte {self.pos}")


_MAX_DIMS = 4  # GGML_MAX_DIMS


def _parse(data: bytes, n_tensors: int, n_kv: int, where: Path) -> GGUFHeader:
    cur = _Cursor(data, 24)
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        metadata[key] = cur.value(cur.take("<I"))
    shapes: dict[str, tuple[int, ...]] = {}
    types: dict[str, int] = {}
    offsets: dict[str, int] = {}
    for _ in range(n_tensors):
        name = cur.string()
        n_dims = cur.take("<I")
        if n_dims > _MAX_DIMS:
            raise CheckpointError(f"{where}: GGUF tensor {name!r} has {n_dims} dims (at most {_MAX_DIMS})")
        dims = struct.unpack_from(f"<{n_dims}Q", data, cur.pos)
        cur.pos += 8 * n_dims
        if name in shapes:
            raise CheckpointError(f"{where}: GGUF tensor {name!r} is listed twice")
        types[name] = cur.take("<I")
        offsets[name] = cur.take("<Q")  # relative to the data section; made absolute below
        shapes[name] = tuple(int(d) for d in reversed(dims))
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise CheckpointError(f"{where}: GGUF general.alignment={alignment!r} must be a power of two")
    start = -(-cur.pos // alignment) * alignment
    for name, offset in offsets.items():
        if offset % alignment:
            raise CheckpointError(f"{where}: GGUF tensor {name!r} data offset {offset} is not a multiple of the "
                                  f"alignment {alignment}")
        offsets[name] = start + offset
    return GGUFHeader(metadata, shapes, types, offsets, alignment)


def read_gguf_header(path: str | Path) -> GGUFHeader:
    """Metadata and tensor shapes of a GGUF file (see :class:`GGUFHeader`).

    Raises
    ------
    CheckpointError
        Not a GGUF file (wrong magic), an unsupported version, or a truncated / malformed header.
    """
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY)
    except OSError as e:
        raise CheckpointError(f"{p}: cannot read the GGUF file: {e}") from e
    try:
        return read_gguf_header_fd(fd, p)
    finally:
        os.close(fd)


def read_gguf_header_fd(fd: int, p: Path) -> GGUFHeader:
    """:func:`read_gguf_header` of the file open as ``fd`` (read with ``pread``: the offset is not moved);
    ``p`` names the file in messages."""
    try:
        return _read(fd, p)
    except OSError as e:
        raise CheckpointError(f"{p}: cannot read the GGUF file: {e}") from e


def _read(fd: int, p: Path) -> GGUFHeader:
    head = os.pread(fd, 24, 0)
    if len(head) < 24 or head[:4] != GGUF_MAGIC:
        raise CheckpointError(f"{p} is not a GGUF file (magic {head[:4]!r}, expected {GGUF_MAGIC!r})")
    version, n_tensors, n_kv = struct.unpack("<IQQ", head[4:24])
    if version not in (2, 3):
        raise CheckpointError(f"{p}: GGUF version {version} is not supported (need 2 or 3)")
    file_size = os.fstat(fd).st_size
    # every key/value takes ≥ 13 bytes and every tensor info ≥ 24: larger counts cannot fit in the file
    if n_kv * 13 + n_tensors * 24 > file_size:
        raise CheckpointError(f"{p}: GGUF header claims {n_kv} metadata keys and {n_tensors} tensors, more than "
                              f"a {file_size}-byte file holds")
    # The header sits at the start of the file; read in growing chunks until it parses.
    size = 1 << 22
    while True:
        data = os.pread(fd, size, 0)
        try:
            return _parse(data, n_tensors, n_kv, p)
        except (struct.error, IndexError, UnicodeDecodeError, ValueError, OverflowError, MemoryError) as e:
            if isinstance(e, CheckpointError):
                raise
            if len(data) < size:  # whole file read and still not parsed
                raise CheckpointError(f"{p}: truncated or malformed GGUF header ({type(e).__name__}: {e})") from None
            size *= 4


def read_gguf_metadata(path: str | Path) -> dict[str, Any]:
    """All key/value metadata of a GGUF file (arrays as Python lists).

    Parameters
    ----------
    path : str or Path
        A ``.gguf`` file.

    Returns
    -------
    dict
        e.g. ``{"general.architecture": "llama", "tokenizer.ggml.tokens": [...], ...}``.
    """
    return read_gguf_header(path).metadata
