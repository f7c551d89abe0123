"""Fast reader of a GGUF file's header: key/value metadata and tensor infos (not the tensor data).

`gguf.GGUFReader` builds numpy views for every element of every array (≈4 s for a 49k-token vocabulary);
this parses the header with `struct` in a fraction of that. The model config
(:meth:`~mistral_kernels.config.ModelConfig.from_gguf_metadata`), the tokenizer and the checkpoint's tensor
shapes all come from here; ``GGUFReader`` is only built to read tensor data. Layout (GGUF v2/v3, little
endian)::

    "GGUF" u32 version  u64 n_tensors  u64 n_kv
    n_kv × ( string key, u32 type, value )      string = u64 length + UTF-8 bytes
    array value = u32 element type, u64 count, count × element
    n_tensors × ( string name, u32 n_dims, n_dims × u64 dim, u32 ggml type, u64 offset )

Tensor dims are listed innermost first (ggml order): a [V, H] embedding is stored as dims (H, V).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["GGUFHeader", "read_gguf_header", "read_gguf_metadata"]

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
    """

    metadata: dict[str, Any]
    tensor_shapes: dict[str, tuple[int, ...]]


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
            if inner in _SCALARS:
                fmt = _SCALARS[inner]
                size = struct.calcsize(fmt)
                values = list(struct.unpack_from(f"<{count}{fmt[1]}", self.data, self.pos))
                self.pos += size * count
                return values
            return [self.value(inner) for _ in range(count)]
        raise ValueError(f"GGUF metadata: unknown value type {kind} at byte {self.pos}")


def _parse(data: bytes, n_tensors: int, n_kv: int) -> GGUFHeader:
    cur = _Cursor(data, 24)
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        metadata[key] = cur.value(cur.take("<I"))
    shapes: dict[str, tuple[int, ...]] = {}
    for _ in range(n_tensors):
        name = cur.string()
        n_dims = cur.take("<I")
        dims = struct.unpack_from(f"<{n_dims}Q", data, cur.pos)
        cur.pos += 8 * n_dims
        cur.take("<I")  # ggml type: read with the data (GGUFReader)
        cur.take("<Q")  # offset in the data section
        shapes[name] = tuple(int(d) for d in reversed(dims))
    return GGUFHeader(metadata, shapes)


def read_gguf_header(path: str | Path) -> GGUFHeader:
    """Metadata and tensor shapes of a GGUF file (see :class:`GGUFHeader`).

    Raises
    ------
    ValueError
        Not a GGUF file (wrong magic), an unsupported version (< 2), or a truncated header.
    """
    p = Path(path)
    with open(p, "rb") as f:
        head = f.read(24)
        if len(head) < 24 or head[:4] != b"GGUF":
            raise ValueError(f"{p} is not a GGUF file (magic {head[:4]!r}, expected b'GGUF')")
        version, n_tensors, n_kv = struct.unpack("<IQQ", head[4:24])
        if version < 2:
            raise ValueError(f"{p}: GGUF version {version} is not supported (need 2 or 3)")
        # The header sits at the start of the file; read in growing chunks until it parses.
        size = 1 << 22
        while True:
            f.seek(0)
            data = f.read(size)
            try:
                return _parse(data, n_tensors, n_kv)
            except (struct.error, IndexError, UnicodeDecodeError):
                if len(data) < size:  # whole file read and still truncated
                    raise ValueError(f"{p}: truncated GGUF header") from None
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
