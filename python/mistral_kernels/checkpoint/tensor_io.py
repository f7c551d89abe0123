"""Tensor data in checkpoint files: where each tensor lies, and reading it straight into its destination.

Both file formats are described by a small header (safetensors: a JSON object; GGUF:
:mod:`mistral_kernels.checkpoint.gguf_header`) that gives each tensor a dtype, a shape and a byte range. Every header
is validated against the file before any data is read (byte ranges inside the file and of the size the
dtype and shape imply, GGUF types known), so corrupt files raise
:class:`~mistral_kernels.errors.CheckpointError` naming the file and tensor.

Every function here works on a file already open (a descriptor the
:class:`~mistral_kernels.checkpoint.source.TensorSource` holds): a checkpoint's files are opened once.

Reading (docs/design.md §6), two ways, neither holding a second copy:

- :func:`map_tensors`: a tensor stored in the dtype wanted, on the CPU — or several stored back to back that
  are fused (HF's gate_proj | up_proj) — *is* its bytes in the file: a view of a private memory map
  (``MAP_PRIVATE``: writes stay in the process), populated from the page cache at once
  (``MADV_POPULATE_READ``, no copy, no first-touch faults later). Its memory is the page cache's.
- :func:`read_into`: otherwise the caller allocates the destination (e.g. the q rows of a fused qkv tensor)
  and it is filled with ``os.preadv`` from the file — one copy, no intermediate tensor when the dtype
  already matches. Conversions (another dtype, another device, GGUF dequantization) go through a bounded
  scratch buffer (:data:`CHUNK_BYTES`), where every value is checked finite on the way
  (:mod:`.finite`: one reduction per chunk; a GGUF's block scales are scanned before decoding).

Shape letters: R rows of the outermost dim, C elements per row.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import CheckpointError
from .finite import check_block_scales, require_finite
from .gguf_header import GGUFHeader

__all__ = ["CHUNK_BYTES", "Index", "TensorInfo", "gguf_tensors", "map_packed", "map_tensors", "private_map",
           "read_into", "read_packed", "safetensors_tensors", "selected_shape"]

Index = tuple[slice, ...]  # one slice per dim: the part of a tensor to read (tensor-parallel shards)
CHUNK_BYTES = 16 << 20  # scratch for conversions; also the piece size of parallel direct reads
_HEADER_LIMIT = 100 << 20  # safetensors' own limit on the JSON header
_MADV_POPULATE_READ = 22  # Linux ≥ 5.14; older kernels refuse it and the map fills lazily on first touch

# safetensors dtype names; integer and bool types are read as what they are and rejected by the loader
SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
# GGUF raw (unquantized) types: F32 0, F16 1, BF16 30, F64 28, I8 24, I16 25, I32 26, I64 27
_GGML_RAW = {0: torch.float32, 1: torch.float16, 30: torch.bfloat16, 28: torch.float64, 24: torch.int8,
             25: torch.int16, 26: torch.int32, 27: torch.int64}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a checkpoint file.

    dtype : what reading it gives — the stored dtype, or float32 for a GGUF quantized type (dequantized)
    offset, nbytes : its absolute byte range in ``file``
    ggml_type : GGUF quantized type id (``gguf.GGMLQuantizationType``); None for raw little-endian elements
    type_name : the file's own name for its type ("BF16", "Q4_K", "I64"), for messages
    """

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    file: Path
    offset: int
    nbytes: int
    ggml_type: int | None = None
    type_name: str = ""


# ---------------------------------------------------------------------------------------------- headers
def safetensors_tensors(fd: int, file: Path) -> dict[str, TensorInfo]:
    """The tensors of one ``.safetensors`` file open as ``fd``, from its header (validated against the file
    size); ``file`` names it.

    Layout: u64 little-endian N, N bytes of JSON ``{name: {"dtype", "shape", "data_offsets": [b, e]}}``
    (offsets relative to the end of the header), then the data.
    """
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, 8, 0)
        if len(head) < 8:
            raise CheckpointError(f"{file}: truncated safetensors file ({size} bytes, no header)")
        (n,) = struct.unpack("<Q", head)
        if n > min(size - 8, _HEADER_LIMIT):
            raise CheckpointError(f"{file}: safetensors header length {n} exceeds the file ({size} bytes) or "
                                  f"the {_HEADER_LIMIT}-byte limit")
        header = json.loads(os.pread(fd, n, 8))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise CheckpointError(f"{file}: unreadable safetensors header ({type(e).__name__}: {e})") from e
    if not isinstance(header, dict):
        raise CheckpointError(f"{file}: safetensors header is not a JSON object")
    base, data_size = 8 + n, size - 8 - n
    out: dict[str, TensorInfo] = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        where = f"{file}: tensor {name!r}"
        if not isinstance(spec, dict):
            raise CheckpointError(f"{where}: header entry is not an object")
        kind, shape, offsets = spec.get("dtype"), spec.get("shape"), spec.get("data_offsets")
        if kind not in SAFETENSORS_DTYPES:
            raise CheckpointError(f"{where}: dtype {kind!r} is not supported ({', '.join(SAFETENSORS_DTYPES)})")
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise CheckpointError(f"{where}: shape {shape!r} is not a list of non-negative integers")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
                and 0 <= offsets[0] <= offsets[1] <= data_size):
            raise CheckpointError(f"{where}: data_offsets {offsets!r} are not a byte range inside the "
                                  f"{data_size}-byte data section")
        dtype = SAFETENSORS_DTYPES[kind]
        nbytes = math.prod(shape) * dtype.itemsize
        if offsets[1] - offsets[0] != nbytes:
            raise CheckpointError(f"{where}: {kind} {shape} needs {nbytes} bytes, data_offsets give "
                                  f"{offsets[1] - offsets[0]}")
        out[name] = TensorInfo(name, tuple(shape), dtype, file, base + offsets[0], nbytes, None, kind)
    _check_disjoint(file, out.values())
    return out


def _check_disjoint(file: Path, infos: Iterable[TensorInfo]) -> None:
    """CheckpointError naming both tensors when two non-empty tensors share bytes (one would alias the other,
    and writing one — a private map is writable — would change both)."""
    ordered = sorted((t for t in infos if t.nbytes), key=lambda t: t.offset)
    for a, b in zip(ordered, ordered[1:]):
        if b.offset < a.offset + a.nbytes:
            raise CheckpointError(f"{file}: tensors {a.name!r} (bytes {a.offset}..{a.offset + a.nbytes}) and "
                                  f"{b.name!r} (bytes {b.offset}..{b.offset + b.nbytes}) overlap in the file: "
                                  "each tensor needs bytes of its own (the file is corrupt or hand-edited)")


def gguf_tensors(file: Path, header: GGUFHeader, size: int) -> dict[str, TensorInfo]:
    """The tensors of a GGUF file of ``size`` bytes: each type known, its size implied by type and shape, and
    the data where the header says — inside the file, not overlapping the next tensor, with no more than
    alignment padding after it (a type edited in place changes the implied size and is caught here)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    out: dict[str, TensorInfo] = {}
    for name, shape in header.tensor_shapes.items():
        type_id, offset = header.tensor_types[name], header.tensor_offsets[name]
        where = f"{file}: GGUF tensor {name!r}"
        try:
            qtype = GGMLQuantizationType(type_id)
            block, type_size = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise CheckpointError(f"{where}: unknown ggml type {type_id}") from None
        if shape and shape[-1] % block:
            raise CheckpointError(f"{where}: rows of {shape[-1]} elements are not whole {qtype.name} blocks of "
                                  f"{block}")
        nbytes = math.prod(shape) // block * type_size
        raw = _GGML_RAW.get(type_id)
        out[name] = TensorInfo(name, shape, raw if raw is not None else torch.float32, file, offset, nbytes,
                               None if raw is not None else type_id, qtype.name)
    ordered = sorted(out.values(), key=lambda t: t.offset)
    for t, following in zip(ordered, [*(u.offset for u in ordered[1:]), size]):
        end = t.offset + t.nbytes
        if end > following:
            what = "the end of the file" if t is ordered[-1] else "the next tensor's data"
            raise CheckpointError(f"{file}: GGUF tensor {t.name!r} ({t.type_name} {list(t.shape)}) needs "
                                  f"{t.nbytes} bytes at offset {t.offset}, past {what} at byte {following}")
        if t is not ordered[-1] and following - end >= header.alignment:
            raise CheckpointError(f"{file}: GGUF tensor {t.name!r} is {t.type_name} {list(t.shape)} = {t.nbytes} "
                                  f"bytes, but {following - t.offset} bytes lie before the next tensor: its type "
                                  "does not match its data")
    return out


# ---------------------------------------------------------------------------------------------- reading
def selected_shape(shape: tuple[int, ...], index: Index | None) -> tuple[int, ...]:
    """The shape of ``tensor[index]`` (``index`` one slice per dim, or None = all)."""
    if index is None:
        return shape
    return tuple(len(range(*s.indices(d))) for s, d in zip(index, shape))


def read_into(fd: int, info: TensorInfo, out: torch.Tensor, index: Index | None = None) -> None:
    """Fill ``out`` (contiguous, shape :func:`selected_shape`, any dtype / device) with ``info``'s tensor, or
    the part ``index`` selects, read from the open file ``fd``."""
    want = selected_shape(info.shape, index)
    if tuple(out.shape) != want or not out.is_contiguous():
        raise ValueError(f"read_into: out must be contiguous {list(want)}, got {list(out.shape)}")
    if out.numel() == 0:
        return
    if info.ggml_type is not None:
        _read_quantized(fd, info, out, index)
        return
    shape = info.shape or (1,)
    index = index or tuple(slice(None) for _ in shape)
    runs = _runs(shape, index)
    item = info.dtype.itemsize
    flat = out.view(-1)
    if len(runs) > 1 and sum(n for _, n in runs) * item < 256 * len(runs) * 1024:  # many small runs (columns)
        _read_by_rows(fd, info, shape, index, out)
        return
    pos = 0
    for start, count in runs:
        _read_range(fd, info, start, flat[pos:pos + count])
        pos += count


def map_tensors(infos: Sequence[TensorInfo], dtype: torch.dtype, map_of: Callable[[Path], mmap.mmap]
                ) -> torch.Tensor | None:
    """A 1-D tensor over the bytes of ``infos`` through a private memory map of their file, or None unless they
    are raw tensors of ``dtype`` lying back to back in one file (then the caller copies instead).

    ``map_of(file)`` gives the file's map (the source makes one per file, from the descriptor it holds); each
    tensor keeps its map alive (``torch.frombuffer``), so the map goes when the last weight viewing it does.
    """
    if any(t.ggml_type is not None or t.dtype != dtype for t in infos):
        return None
    return _map_run(infos, dtype, map_of)


def map_packed(infos: Sequence[TensorInfo], map_of: Callable[[Path], mmap.mmap]) -> torch.Tensor | None:
    """uint8 [bytes] over GGUF quantized tensors lying back to back in one file (their blocks as stored), or
    None (then the caller reads them with :func:`read_packed`)."""
    if any(t.ggml_type is None for t in infos):
        return None
    return _map_run(infos, torch.uint8, map_of)


def private_map(fd: int) -> mmap.mmap:
    """A private (copy-on-write) map of the whole file open as ``fd``; writes stay in the process."""
    return mmap.mmap(fd, 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)


def read_packed(fd: int, info: TensorInfo, out: torch.Tensor) -> None:
    """The stored bytes of a GGUF quantized tensor → ``out`` (uint8, contiguous, CPU, ``info.nbytes``)."""
    if out.dtype != torch.uint8 or not out.is_contiguous() or out.numel() != info.nbytes or not out.is_cpu:
        raise ValueError(f"read_packed: out must be contiguous CPU uint8 of {info.nbytes} bytes")
    _pread(fd, info.offset, _bytes_of(out))


def _map_run(infos: Sequence[TensorInfo], dtype: torch.dtype, map_of: Callable[[Path], mmap.mmap]
             ) -> torch.Tensor | None:
    """The mapped bytes of tensors back to back in one file, as 1-D ``dtype``; None if they are not."""
    first, last = infos[0], infos[-1]
    if any(t.file != first.file for t in infos):
        return None
    if any(b.offset != a.offset + a.nbytes for a, b in zip(infos, infos[1:])) or first.offset % dtype.itemsize:
        return None
    nbytes = last.offset + last.nbytes - first.offset
    if nbytes == 0:
        return None
    m = map_of(first.file)
    start = first.offset - first.offset % mmap.PAGESIZE
    try:
        m.madvise(_MADV_POPULATE_READ, start, first.offset + nbytes - start)
    except OSError:
        pass
    return torch.frombuffer(m, dtype=dtype, count=nbytes // dtype.itemsize, offset=first.offset)


def _runs(shape: tuple[int, ...], index: Index) -> list[tuple[int, int]]:
    """Contiguous (first element, element count) runs of ``tensor[index]`` in output order (steps of 1)."""
    ranges = [range(*s.indices(d)) for s, d in zip(index, shape)]
    if any(r.step != 1 for r in ranges):
        raise ValueError(f"read_into: index slices must have step 1, got {index}")
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    inner = len(shape) - 1  # the innermost dim not read whole: dims after it are, so a run spans them
    while inner > 0 and len(ranges[inner]) == shape[inner]:
        inner -= 1
    runs = [(ranges[inner].start * strides[inner], len(ranges[inner]) * strides[inner])]
    for d in range(inner - 1, -1, -1):  # outer dims: one run per selected index, in output order
        runs = [(i * strides[d] + s, n) for i in ranges[d] for s, n in runs]
    return runs


def _read_by_rows(fd: int, info: TensorInfo, shape: tuple[int, ...], index: Index, out: torch.Tensor) -> None:
    """A selection of many short runs (a column shard): read whole rows of dim 0 in chunks, keep the columns."""
    rows = range(*index[0].indices(shape[0]))
    row_elems = math.prod(shape[1:])
    per_chunk = max(1, CHUNK_BYTES // max(1, row_elems * info.dtype.itemsize))
    for a in range(0, len(rows), per_chunk):
        n = min(per_chunk, len(rows) - a)
        block = torch.empty((n, *shape[1:]), dtype=info.dtype)
        first = (rows.start + a) * row_elems
        _pread(fd, info.offset + first * info.dtype.itemsize, _bytes_of(block))
        require_finite(block, info, first)
        out[a:a + n].copy_(block[(slice(None), *index[1:])])


def _read_range(fd: int, info: TensorInfo, start: int, out: torch.Tensor) -> None:
    """``out.numel()`` elements of ``info`` from element ``start`` → ``out`` (1-D contiguous): read straight
    when the dtype matches on the CPU, else converted through a scratch whose values are checked finite."""
    dtype, offset = info.dtype, info.offset + start * info.dtype.itemsize
    if out.dtype == dtype and out.device.type == "cpu":
        _pread(fd, offset, _bytes_of(out))
        return
    per = max(1, CHUNK_BYTES // dtype.itemsize)
    scratch = torch.empty(min(per, out.numel()), dtype=dtype)
    for a in range(0, out.numel(), per):
        part = scratch[:min(per, out.numel() - a)]
        _pread(fd, offset + a * dtype.itemsize, _bytes_of(part))
        require_finite(part, info, start + a)
        out[a:a + part.numel()].copy_(part)


def _bytes_of(t: torch.Tensor) -> memoryview:
    """A writable byte view of a contiguous CPU tensor's memory."""
    return memoryview(t.view(-1).view(torch.uint8).numpy()).cast("B")


def _pread(fd: int, offset: int, buf: memoryview) -> None:
    """Fill ``buf`` from byte ``offset`` of ``fd``; large buffers in parallel pieces (preadv releases the GIL)."""
    pieces = [(a, buf[a:a + CHUNK_BYTES]) for a in range(0, len(buf), CHUNK_BYTES)]
    if len(pieces) > 1:
        list(_pool().map(lambda p: _pread_all(fd, offset + p[0], p[1]), pieces))
    else:
        _pread_all(fd, offset, buf)


def _pread_all(fd: int, offset: int, buf: memoryview) -> None:
    done = 0
    while done < len(buf):
        n = os.preadv(fd, [buf[done:]], offset + done)
        if n <= 0:
            raise CheckpointError(f"unexpected end of file at byte {offset + done} (file changed while loading?)")
        done += n


_POOL: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max(1, min(4, os.cpu_count() or 1)), thread_name_prefix="mk-read")
    return _POOL


def _read_quantized(fd: int, info: TensorInfo, out: torch.Tensor, index: Index | None) -> None:
    """Dequantize a GGUF tensor with the ``gguf`` package, a bounded chunk of rows at a time: each chunk's block
    scales checked before decoding, its values after (:mod:`.finite`)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    qtype = GGMLQuantizationType(info.ggml_type)
    block, type_size = GGML_QUANT_SIZES[qtype]
    cols = info.shape[-1] if info.shape else 1
    rows = math.prod(info.shape[:-1])
    row_bytes = cols // block * type_size
    full = out.view(rows, cols) if index is None else torch.empty((rows, cols), dtype=torch.float32)
    per = max(1, (CHUNK_BYTES // 4) // max(1, cols * 4))  # fp32 output and temporaries stay within the chunk
    raw = np.empty((min(per, rows), row_bytes), dtype=np.uint8)
    for a in range(0, rows, per):
        n = min(per, rows - a)
        part = raw[:n]
        _pread_all(fd, info.offset + a * row_bytes, memoryview(part).cast("B"))
        check_block_scales(info, torch.from_numpy(part).view(-1), type_size, a * row_bytes // type_size)
        try:
            values = dequantize(part, qtype)
        except NotImplementedError as e:
            raise CheckpointError(f"{info.file}: tensor {info.name} has type {qtype.name}, which the gguf package "
                                  "cannot dequantize") from e
        decoded = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32).reshape(n, cols))
        require_finite(decoded, info, a * cols)
        full[a:a + n].copy_(decoded)
    if index is not None:
        out.copy_(full.view(info.shape)[index])
