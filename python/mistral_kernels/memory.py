"""Will it fit? Weights + KV cache vs the memory available (a warning), and a KV pool larger than the whole
device (an error), checked before loading.

A model that does not fit is otherwise found out by the OOM killer, minutes into loading. The estimate is
the weights (parameter count × element size; the loader's peak is the weights plus a bounded scratch,
see checkpoint/tensor_io.py) plus the KV cache pool (blocks × block size × bytes per token).
"""

from __future__ import annotations

import os

import torch

from .config import ModelConfig

__all__ = ["MemoryWarning", "available_memory", "check_kv_pool", "memory_warning", "total_memory"]


class MemoryWarning(UserWarning):
    """The weights and the KV cache asked for exceed the memory available."""


def available_memory(device: torch.device | str) -> int | None:
    """Bytes available for new allocations: ``MemAvailable`` of /proc/meminfo on the CPU, free memory of a
    CUDA device; None when unknown."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return int(torch.cuda.mem_get_info(dev)[0])
    if dev.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def memory_warning(config: ModelConfig, dtype: torch.dtype, device: torch.device | str, kv_tokens: int,
                   available: int | None = None, weight_bytes: int | None = None) -> str | None:
    """A message when weights + a KV cache of ``kv_tokens`` tokens in ``dtype`` exceed ``available`` bytes
    (default: :func:`available_memory`), else None. The message gives the numbers and what to change.
    ``weight_bytes``: the weights' size when known (packed formats,
    :func:`mistral_kernels.checkpoint.footprint.weight_footprint`); default parameters × dtype size."""
    available = available_memory(device) if available is None else available
    if available is None:
        return None
    weights = config.num_parameters() * dtype.itemsize if weight_bytes is None else weight_bytes
    kv = kv_tokens * config.kv_bytes_per_token(dtype)
    if weights + kv <= available:
        return None
    gib = 2 ** 30
    hints = []
    if dtype.itemsize > 2:
        hints.append("a 2-byte dtype (--dtype bf16) halves both")
    if kv > 0:
        hints.append("fewer KV cache blocks (--num-blocks, --max-batch) shrink the cache")
    hints.append("or free memory")
    return (f"the model needs {weights / gib:.1f} GiB of weights + {kv / gib:.1f} GiB of KV cache "
            f"({kv_tokens} tokens) in {str(dtype).removeprefix('torch.')} = {(weights + kv) / gib:.1f} GiB, but only "
            f"{available / gib:.1f} GiB of {torch.device(device).type} memory is available; loading may fail or be "
            f"killed. " + "; ".join(hints) + ".")


def total_memory(device: torch.device) -> int | None:
    """Total bytes of the device's memory (physical RAM for the CPU); None when unknown."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    if device.type == "cpu" and hasattr(os, "sysconf"):
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return None


def check_kv_pool(config: ModelConfig, dtype: torch.dtype, device: str | torch.device, num_blocks: int,
                  block_size: int) -> None:
    """A KV pool larger than the device's whole memory can never be allocated: say so, with the numbers,
    instead of failing inside the allocator (or building a block list of 10**12 entries)."""
    per_token = config.kv_bytes_per_token(dtype)
    need = num_blocks * block_size * per_token
    dev = torch.device(device)
    total = total_memory(dev)
    if total is not None and need > total:
        raise ValueError(f"num_blocks (--num-blocks) = {num_blocks} blocks of {block_size} tokens need "
                         f"{need / 2**30:,.1f} GiB of KV cache ({per_token} bytes per token) but the {dev.type} "
                         f"has {total / 2**30:,.1f} GiB in all; lower --num-blocks (default: sized for --max-batch)")
