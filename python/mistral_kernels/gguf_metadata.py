"""Fast reader of a GGUF file's key/value metadata (not its tensors).

`gguf.GGUFReader` builds numpy views for every element of every array (≈4 s for a 49k-token vocabulary);
this parses the metadata section with `struct` in a fraction of that. Layout (GGUF v2/v3, little endian)::

    "GGUF" u32 version  u64 n_tensors  u64 n_kv
    n_kv × ( string key, u32 type, value )      string = u64 length + UTF-8 bytes
    array value = u32 element type, u64 count, count × element
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

# GGUF value type -> struct format (scalars); 8 = string, 9 = array
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class _Cursor:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

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
    p = Path(path)
    with open(p, "rb") as f:
        head = f.read(24)
        if len(head) < 24 or head[:4] != b"GGUF":
            raise ValueError(f"{p} is not a GGUF file (magic {head[:4]!r}, expected b'GGUF')")
        version, _n_tensors, n_kv = struct.unpack("<IQQ", head[4:24])
        if version < 2:
            raise ValueError(f"{p}: GGUF version {version} is not supported (need 2 or 3)")
        # Metadata sits right after the header; read in growing chunks until it parses.
        size = 1 << 22
        while True:
            f.seek(0)
            data = f.read(size)
            try:
                cur = _Cursor(data)
                cur.pos = 24
                out: dict[str, Any] = {}
                for _ in range(n_kv):
                    key = cur.string()
                    out[key] = cur.value(cur.take("<I"))
                return out
            except (struct.error, IndexError, UnicodeDecodeError):
                if len(data) < size:  # whole file read and still truncated
                    raise ValueError(f"{p}: truncated GGUF metadata") from None
                size *= 4
