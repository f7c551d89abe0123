"""The GPT-2 byte alphabet of byte-level BPE tokenizers: every byte spelled as one printable character."""

from __future__ import annotations

from functools import cache

__all__ = ["byte_alphabet", "byte_of_char"]


@cache
def byte_alphabet() -> dict[int, str]:
    """Byte → its character: printable bytes map to themselves, the others to code points 256+."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


@cache
def byte_of_char() -> dict[str, int]:
    """Character of the alphabet → its byte (the inverse of :func:`byte_alphabet`)."""
    return {c: b for b, c in byte_alphabet().items()}
