"""The block-format table has one source: ``MK_QTYPES`` and ``enum QType`` in csrc/kernels/quant_blocks.h.
:data:`mistral_kernels.quant_formats.QFORMATS` must equal it entry by entry (name, code, QK, bytes per block),
and its GGUF formats must match the ``gguf`` package's ``GGML_QUANT_SIZES`` and type numbers.

``mismatches()`` compares a header text with a table; test_mismatches_are_reported feeds it a header with one
entry changed, one removed and one added, to show each rule fails when broken.
"""

from __future__ import annotations

import re
from pathlib import Path

import gguf
import torch

from mistral_kernels.quant_formats import INT8_ROWWISE, QFORMATS, QFormat, weight_nbytes

HEADER = Path(__file__).resolve().parents[1] / "csrc" / "kernels" / "quant_blocks.h"


def header_formats(text: str) -> dict[str, tuple[int, int, int]]:
    """name → (code, QK, bytes) from ``#define MK_QTYPES(X)`` and ``enum QType`` of a quant_blocks.h text."""
    macro = re.search(r"#define MK_QTYPES\(X\)((?:[^\n]*\\\n)*[^\n]*)", text)
    assert macro, "#define MK_QTYPES(X) not found in csrc/kernels/quant_blocks.h"
    enum = re.search(r"enum QType[^{]*\{([^}]*)\}", text)
    assert enum, "enum QType not found in csrc/kernels/quant_blocks.h"
    codes = {m[1]: int(m[2]) for m in re.finditer(r"(k\w+)\s*=\s*(\d+)", enum[1])}
    entries = re.findall(r"X\((k\w+),\s*\"(\w+)\",\s*(\d+),\s*(\d+)\)", macro[1])
    assert entries, "MK_QTYPES has no X(code, name, QK, bytes) entries"
    return {name: (codes[code], int(qk), int(nb)) for code, name, qk, nb in entries}


def mismatches(text: str, table: dict[str, QFormat]) -> list[str]:
    found = []
    header = header_formats(text)
    for name in sorted(header.keys() - table.keys()):
        found.append(f"MK_QTYPES has {name}, the Python table does not")
    for name in sorted(table.keys() - header.keys()):
        found.append(f"the Python table has {name}, MK_QTYPES does not")
    for name in sorted(header.keys() & table.keys()):
        f = table[name]
        if (f.qtype, f.block, f.bytes) != header[name]:
            found.append(f"{name}: Python (code, QK, bytes) {(f.qtype, f.block, f.bytes)} != MK_QTYPES {header[name]}")
    return found


def test_table_is_mk_qtypes() -> None:
    text = HEADER.read_text()
    assert len(header_formats(text)) == len(QFORMATS) >= 7
    assert mismatches(text, QFORMATS) == []


def test_mismatches_are_reported() -> None:
    text = HEADER.read_text()
    changed = text.replace('X(kQ4_1, "Q4_1", 32, 20)', 'X(kQ4_1, "Q4_1", 32, 21)')
    assert changed != text
    assert mismatches(changed, QFORMATS) == ["Q4_1: Python (code, QK, bytes) (3, 32, 20) != MK_QTYPES (3, 32, 21)"]
    removed = text.replace('X(kQ5_K, "Q5_K", 256, 176)', "")
    assert mismatches(removed, QFORMATS) == ["the Python table has Q5_K, MK_QTYPES does not"]
    added = text.replace('X(kInt8Rowwise, "INT8_ROWWISE", 1, 1)',
                         'X(kInt8Rowwise, "INT8_ROWWISE", 1, 1) X(kQ4_0, "Q2_K", 256, 84)')
    assert mismatches(added, QFORMATS) == ["MK_QTYPES has Q2_K, the Python table does not"]
    recoded = text.replace("kQ8_0 = 8,", "kQ8_0 = 9,")
    assert mismatches(recoded, QFORMATS) == ["Q8_0: Python (code, QK, bytes) (8, 32, 34) != MK_QTYPES (9, 32, 34)"]


def test_gguf_formats_match_the_gguf_package() -> None:
    for name, f in QFORMATS.items():
        if f.qtype == INT8_ROWWISE:
            assert not hasattr(gguf.GGMLQuantizationType, name)  # the project's own format
            continue
        t = gguf.GGMLQuantizationType[name]
        assert int(t) == f.qtype, name
        assert gguf.GGML_QUANT_SIZES[t] == (f.block, f.bytes), name


def test_weight_nbytes() -> None:
    """Blocks per row × bytes per block × rows; INT8_ROWWISE adds an fp32 scale per row; dense: elements × size.
    Expected values from the gguf package's sizes and torch's element sizes."""
    for name, f in QFORMATS.items():
        if f.qtype == INT8_ROWWISE:
            assert weight_nbytes((3, 5, 64), f) == 3 * 5 * 64 + 4 * 3 * 5
            continue
        qk, nb = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]]
        assert weight_nbytes((576, 4 * 256), f) == 576 * (4 * 256 // qk) * nb, name
    assert weight_nbytes((576, 576), torch.bfloat16) == torch.empty(576, 576, dtype=torch.bfloat16).nbytes
    assert weight_nbytes((7,), torch.float32) == 28
