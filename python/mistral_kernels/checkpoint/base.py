"""A checkpoint opened once: :class:`Checkpoint` and the list of formats it detects (:data:`FORMATS`).

``Checkpoint.open(path)`` looks at the path once (:class:`~mistral_kernels.checkpoint.source.Probe`), lets
the first format of :data:`FORMATS` that recognises it read the config and the tensor headers once, and keeps
the files open; every later question — the dtype, the footprint, the weights, the tokenizer — is answered
from that one read. Close it (or use it as a context manager) when done; weights mapped from the files
stay valid after closing.

Default dtype (``dtype=None``, like transformers' ``dtype="auto"``): the checkpoint's own — the dtype its
config states (config.json's ``dtype`` / ``torch_dtype``), else the stored dtype of most of the weights
(consolidated files: bf16 as Mistral publishes them; GGUF: F32 / F16 / BF16, quantized types → fp32 as they
dequantize). On the CPU fp16 becomes bf16 by default (same size; fp16 values with |x| < 2^-14 lose
precision, others keep 8 of their 11 significant bits; an explicit ``dtype=torch.float16`` keeps fp16,
computed in fp32) and fp64 becomes fp32 (:meth:`Checkpoint.default_dtype`).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..config import ModelConfig
from ..errors import CheckpointError
from ..quant_weight import PackedWeight
from .consolidated import CONSOLIDATED
from .finite import Part, check_quantized, scan_weight
from .footprint import WeightFootprint, weight_footprint
from .format import Format, TokenizerSource
from .fusion import bytes_to_read, fusion_plan, read_fused
from .gguf import GGUF
from .hf import HF
from .naming import Entry, ShardFn, check, expected_shapes, full_index, rename
from .packing import PackingPlan, check_quantize, packing_plan, quantize_fused, stored_dtype
from .source import Probe, TensorSource
from .tensor_io import Index, selected_shape

__all__ = ["FORMATS", "Checkpoint", "QuantizedFallbackWarning", "load_checkpoint", "load_config", "opened"]

# The formats, in detection order: the first that recognises a path reads it (HF before consolidated: a
# Mistral repository holding both loads its HF files). A new format is one module and one entry here.
FORMATS: tuple[Format, ...] = (HF, CONSOLIDATED, GGUF)


class QuantizedFallbackWarning(UserWarning):
    """Some quantized tensors of a GGUF were dequantized at load (no native kernel for their format)."""


class Checkpoint:
    """A checkpoint whose config and tensor headers were read once, its files held open.

    Attributes
    ----------
    path : the file or directory
    format : ``"hf"``, ``"consolidated"`` or ``"gguf"`` (:data:`FORMATS`)
    config : the model config
    source : the tensors under the file's own names (:class:`~mistral_kernels.checkpoint.source.TensorSource`)
    """

    def __init__(self, path: Path, fmt: Format, probe: Probe) -> None:
        contents = fmt.read(probe)
        self.path = path
        self._format = fmt
        self.config: ModelConfig = contents.config
        self.source: TensorSource = contents.source
        self._stated_dtype = contents.stated_dtype
        self._tokenizer = contents.tokenizer
        self._entries: dict[str, Entry] | None = None

    @classmethod
    def open(cls, path: str | Path) -> Checkpoint:
        """Detect the format of ``path`` from its contents and read its config and headers.

        Raises
        ------
        CheckpointError
            The path does not exist, is not a regular file or directory, holds none of the formats (the
            message lists what it found), or its config / headers are unreadable, corrupt or out of range.
        UnsupportedCheckpointError
            (a CheckpointError) The config describes a model this package does not implement.
        """
        p = Path(path)
        probe = Probe(p)
        try:
            for fmt in FORMATS:
                if fmt.detect(probe):
                    return cls(p, fmt, probe)
            raise CheckpointError(_unrecognised(probe))
        finally:
            probe.close()

    @property
    def format(self) -> str:
        return self._format.name

    # ------------------------------------------------------------------ headers only
    def entries(self) -> dict[str, Entry]:
        """Canonical name → entry, checked against the config (once; CheckpointError listing every missing /
        unexpected / mis-shaped / integer-typed tensor)."""
        if self._entries is None:
            entries, unexpected = rename(self.source, self._format.rules, self._format.ignored)
            check(self.path, self.format, entries, unexpected, self.config)
            self._entries = {name: entries[name] for name in expected_shapes(self.config)}
        return self._entries

    def checkpoint_dtype(self) -> torch.dtype:
        """The checkpoint's own dtype (module docstring): the one its config states, else the dtype holding most
        of the stored weight elements (GGUF quantized types count as fp32)."""
        if self._stated_dtype is not None:
            return self._stated_dtype
        counts: dict[torch.dtype, int] = {}
        for t in self.source.tensors.values():
            if t.dtype.is_floating_point:
                counts[t.dtype] = counts.get(t.dtype, 0) + math.prod(t.shape)
        if not counts:
            raise CheckpointError(f"{self.path}: no floating-point tensors to take a dtype from")
        return max(counts, key=lambda d: counts[d])

    def default_dtype(self, device: torch.device | str = "cpu") -> torch.dtype:
        """The dtype a model loads in when none is asked: :meth:`checkpoint_dtype`, with fp64 → fp32 and, on the
        CPU, fp16 → bf16 (an explicit fp16 runs there as well)."""
        dtype = self.checkpoint_dtype()
        if dtype == torch.float64:
            return torch.float32
        if dtype == torch.float16 and torch.device(device).type == "cpu":
            return torch.bfloat16
        return dtype

    def packing(self, *, quantized: bool = True, quantize: str | None = None, sharded: bool = False) -> PackingPlan:
        """Which weights stay packed with these options (:func:`~mistral_kernels.checkpoint.packing.packing_plan`)."""
        check_quantize(quantize, sharded)
        return packing_plan(self.config, self.entries(), quantized=quantized, quantize=quantize, sharded=sharded)

    def footprint(self, dtype: torch.dtype, *, quantized: bool = True, quantize: str | None = None
                  ) -> WeightFootprint:
        """What the weights take loaded in ``dtype`` with these options (:mod:`.footprint`); headers only."""
        plan = self.packing(quantized=quantized, quantize=quantize)
        return weight_footprint(plan, self.entries()["embed"].stored, dtype)

    def tokenizer_source(self) -> TokenizerSource:
        """Where the tokenizer is: the checkpoint directory, or a GGUF's metadata (no second read of the file);
        :func:`mistral_kernels.tokenization.load_tokenizer` takes the checkpoint itself."""
        return self._tokenizer

    # ------------------------------------------------------------------ data
    def load(self, device: torch.device | str = "cpu", dtype: torch.dtype | None = None, *, progress: bool = False,
             shard: ShardFn | None = None, map_files: bool = True, quantized: bool = True,
             quantize: str | None = None, check_tensors: bool = False) -> dict[str, torch.Tensor | PackedWeight]:
        """The fused weights (names in :mod:`.fusion`) of ``dtype`` on ``device``.

        ``dtype=None`` loads in the checkpoint's own dtype (:meth:`default_dtype`). ``progress`` shows a tqdm
        bar over the bytes read. ``map_files`` (CPU): weights stored in ``dtype`` — fused parts too when they
        lie back to back — are private memory maps of the files, populated from the page cache (no copy; the
        memory is the page cache's; writes stay private); ``False`` copies every weight into process memory
        (then nothing depends on the files after loading).

        ``shard(config, canonical_name)`` → slices (or None = whole): read only that part of each tensor (one
        tensor-parallel rank, :meth:`mistral_kernels.parallel.ParallelContext.shard`); fusion then joins the
        parts (the rank's q|k|v rows, w1|w3 rows). Safetensors read only the selected bytes; GGUF tensors are
        dequantized whole, then cut.

        Quantized weights follow :meth:`packing` (:mod:`.packing`): ``quantized`` (default) keeps a GGUF's
        matrices in their stored formats where a native kernel exists (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K) as
        packed weights, memory-mapped; ``dtype`` then sets the activations, norms, embedding and KV cache;
        other formats are dequantized with one notice (a :class:`QuantizedFallbackWarning`).
        ``quantized=False`` (or a ``shard``) dequantizes every tensor. ``quantize="int8"`` stores every matrix
        of any format as INT8_ROWWISE (per output row symmetric; a GGUF's blocks are decoded first). The tied
        LM head of a packed embedding is returned as ``lm_head`` (the packed blocks; ``embed`` is dequantized).

        Non-finite weights (:mod:`.finite`): always refused where loading touches every value anyway — a GGUF
        block's fp16 scales (packed, dequantized or requantized), values converted to another dtype or device,
        dequantized, or quantized to int8. ``check_tensors`` (llama.cpp's ``--check-tensors``) also scans every
        dense weight as loaded, memory-mapped ones included (one pass over the weights: README, "Loading").

        Raises
        ------
        CheckpointError
            corrupt files, tensors missing / unexpected / mis-shaped / integer-typed (all in one message), or
            an inf / NaN weight (the file and tensor named).
        """
        plan = self.packing(quantized=quantized, quantize=quantize, sharded=shard is not None)
        if dtype is None:
            dtype = self.default_dtype(device)
        entries = self.entries()
        parts = {name: (e, None if shard is None else shard(self.config, name)) for name, e in entries.items()}
        parts = {name: (e, None if index is None else full_index(index, len(e.shape)))
                 for name, (e, index) in parts.items()}
        fusion = fusion_plan(self.config)
        total = sum(bytes_to_read(*parts[p]) for _, names in fusion for p in names)
        mapped = self.source if map_files else None
        weights: dict[str, torch.Tensor | PackedWeight] = {}
        with tqdm(total=total, desc=f"loading {self.path.name}", unit="B", unit_scale=True, unit_divisor=1024,
                  disable=not progress) as bar:
            for fused, names in fusion:
                fused_parts = [parts[n] for n in names]
                mode = plan.modes[fused]
                if mode == "int8":
                    dense = read_fused(fused_parts, "cpu", stored_dtype(plan.parts[fused]), bar.update, mapped)
                    int8 = weights[fused] = quantize_fused(dense, device)
                    check_quantized(fused, int8.scales, dense, _finite_parts(fused_parts))
                elif mode == "packed":
                    shape = (sum(e.shape[0] for e, _ in fused_parts), *fused_parts[0][0].shape[1:])
                    weights[fused] = self._format.read_packed(plan.parts[fused], shape, self.source, device)
                    bar.update(sum(t.nbytes for t in plan.parts[fused]))
                else:
                    weights[fused] = read_fused(fused_parts, device, dtype, bar.update, mapped)
                    if check_tensors:
                        scan_weight(fused, weights[fused], _finite_parts(fused_parts))
            if plan.tied_head:
                embed = entries["embed"]
                weights["lm_head"] = self._format.read_packed(embed.stored, embed.shape, self.source, device)
        if plan.fallback:
            kinds = ", ".join(f"{k} ({n} tensors)" for k, n in sorted(plan.fallback.items()))
            warnings.warn(f"{self.path.name}: {kinds} have no native kernel: dequantized to "
                          f"{str(dtype).removeprefix('torch.')} at load, with the matrices fused with them",
                          QuantizedFallbackWarning, stacklevel=2)
        return weights

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Close the files (weights mapped from them stay valid)."""
        self.source.close()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Checkpoint({str(self.path)!r}, format={self.format!r})"


@contextlib.contextmanager
def opened(checkpoint: Checkpoint | str | Path) -> Iterator[Checkpoint]:
    """``checkpoint`` itself (left open), or the path opened for the ``with`` block and closed after it."""
    if isinstance(checkpoint, Checkpoint):
        yield checkpoint
        return
    with Checkpoint.open(checkpoint) as ckpt:
        yield ckpt


def load_checkpoint(checkpoint: Checkpoint | str | Path, *, device: torch.device | str = "cpu",
                    dtype: torch.dtype | None = None, progress: bool = False, shard: ShardFn | None = None,
                    map_files: bool = True, quantized: bool = True, quantize: str | None = None,
                    check_tensors: bool = False) -> tuple[ModelConfig, dict[str, torch.Tensor | PackedWeight]]:
    """(config, fused weights) of a checkpoint or path: :meth:`Checkpoint.load` with the same options."""
    with opened(checkpoint) as ckpt:
        return ckpt.config, ckpt.load(device, dtype, progress=progress, shard=shard, map_files=map_files,
                                      quantized=quantized, quantize=quantize, check_tensors=check_tensors)


def load_config(checkpoint: Checkpoint | str | Path) -> ModelConfig:
    """The config of a checkpoint or path (HF directory, Mistral consolidated directory or GGUF file).

    Reads only the config and the tensor headers (GGUF: the fast header reader, no tensor data).

    Raises
    ------
    CheckpointError
        The path holds no known format, the config file is unreadable, or a field is missing or out of range
        (:mod:`mistral_kernels.checkpoint.fields`); the message names the file and the field.
    UnsupportedCheckpointError
        (a CheckpointError) The config describes a model this package does not implement.
    """
    with opened(checkpoint) as ckpt:
        return ckpt.config


def _unrecognised(probe: Probe) -> str:
    """The message for a path no format recognises: what was expected, and what was found."""
    p = probe.path
    if probe.is_file:
        files = [f.expects for f in FORMATS if f.is_file]
        return (f"{p} is a file but not {' or '.join(files)}; found the bytes {probe.magic[:4]!r}. Pass a model "
                "file or a checkpoint directory")
    if probe.is_dir:
        dirs = [f.expects for f in FORMATS if not f.is_file]
        return (f"{p}: not a checkpoint directory — expected {' or '.join(dirs)}; found "
                f"{sorted(q.name for q in p.iterdir())[:20]}")
    if p.exists():
        return f"checkpoint path {p} is not a regular file or a directory"
    return f"checkpoint path {p} does not exist"


def _finite_parts(parts: list[tuple[Entry, Index | None]]) -> list[Part]:
    """The parts of a fused weight as the finiteness checks name them (file tensor, files, rows)."""
    return [Part(e.origin, tuple(sorted({str(t.file) for t in e.stored})), selected_shape(e.shape, i)[0])
            for e, i in parts]
