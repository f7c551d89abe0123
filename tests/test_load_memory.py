"""Loading costs about the weights' own memory: peak RSS of loading a ~200 MB random checkpoint,
measured in a fresh process, is at most 1.15 × the weight bytes + a fixed allowance, for HF sharded,
Mistral consolidated and GGUF (Q8_0, dequantized to fp32 with ``quantized=False``; and kept packed, the
default: then the weights are the packed blocks plus the fp32 embedding and norms) checkpoints.

The allowance is measured, not guessed: the probe first loads a tiny checkpoint of the same format (imports,
allocator arenas, reader threads), then resets the peak (``/proc/self/clear_refs`` = 5) and takes the
resident size as its baseline; what the big load adds on top is compared with the weights. The loader's own
scratch (tensor_io.CHUNK_BYTES, GGUF dequantization chunks) must fit in ``ALLOWANCE``. Weights mapped from
the files count (their pages are touched before the peak is read). Loading with a second copy of any layer
(the unfused parts next to the fused tensor, or source pages kept mapped next to a copy) needs ≥ 1.5×.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mistral_kernels.config import ModelConfig

from .helpers.random_checkpoints import write_random_checkpoint

ALLOWANCE = 48 << 20
SMALL = ModelConfig(dim=1024, n_layers=6, n_heads=8, n_kv_heads=2, head_dim=128, hidden_dim=3584, vocab_size=8192,
                    max_position=4096)  # 98M parameters: 196 MB in bf16
TINY = SMALL.replace(dim=64, n_layers=1, hidden_dim=64, vocab_size=64, head_dim=16, n_heads=4)

FORMATS = ("hf", "consolidated", "gguf", "gguf-native")
PROBE = r"""
import gc, json, sys
import torch
from mistral_kernels import load_model

def status(key):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith(key + ":"))

results = {}
for fmt, tiny, big in zip(sys.argv[1::3], sys.argv[2::3], sys.argv[3::3]):
    kw = {"quantized": fmt == "gguf-native"}
    load_model(tiny, **kw)
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak RSS (VmHWM) to the current RSS
    base = status("VmRSS")
    model = load_model(big, **kw)
    seen, nbytes = set(), 0
    for owner in (model, *model.layers):  # touch every page (weights mapped lazily on kernels < 5.14)
        for t in vars(owner).values():
            parts = getattr(t, "parts", (t,))
            for t in parts:
                data = getattr(t, "qweight", t)
                if isinstance(data, torch.Tensor) and data.data_ptr() not in seen:
                    seen.add(data.data_ptr())
                    nbytes += getattr(t, "nbytes", data.numel() * data.element_size())
                    data.view(-1).view(torch.uint8)[::4096].sum()
    peak = status("VmHWM")
    results[fmt] = {"base": base, "peak": peak, "dtype": str(model.dtype), "weights": nbytes}
    del model
    gc.collect()
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, object]]:
    """Peak RSS of loading each format's ~200 MB checkpoint, all in one fresh process (glibc told to return
    every large block to the system when freed, so one format's freed model does not hide the next's cost)."""
    root = tmp_path_factory.mktemp("rss")
    args = []
    for fmt in FORMATS:
        config, kw = SMALL, {"dtype": torch.bfloat16, "seed": None}
        if fmt == "hf":
            kw["shards"] = 4
        if fmt == "gguf":  # Q8_0 file (1.06 bytes/weight) dequantized to fp32: 188 MiB of weights
            config, kw = SMALL.replace(n_layers=3, vocab_size=4096), {"gguf_type": "Q8_0", "seed": None}
        if fmt == "gguf-native":  # Q8_0 kept packed: 192 MiB of blocks + 64 MiB of fp32 embedding
            config, kw = SMALL.replace(n_layers=14, vocab_size=16384), {"gguf_type": "Q8_0", "seed": None}
        name = f"{fmt}.gguf" if fmt.startswith("gguf") else fmt
        (root / "tiny").mkdir(exist_ok=True)
        kind = "gguf" if fmt.startswith("gguf") else fmt
        write_random_checkpoint(TINY, root / "tiny" / name, kind, **kw)
        write_random_checkpoint(config, root / name, kind, **kw)
        args += [fmt, str(root / "tiny" / name), str(root / name)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
    run = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, env=env, timeout=180)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc (peak RSS reset)")
@pytest.mark.parametrize("fmt", FORMATS)
def test_peak_rss_is_about_the_weights(fmt: str, measured: dict[str, dict[str, int]]) -> None:
    r = measured[fmt]
    assert r["dtype"] == ("torch.float32" if fmt.startswith("gguf") else "torch.bfloat16")
    assert r["weights"] > 190e6
    added = r["peak"] - r["base"]
    print(f"{fmt}: weights {r['weights'] / 2**20:.0f} MiB, peak RSS added {added / 2**20:.0f} MiB "
          f"({added / r['weights']:.3f}x)")
    assert added <= 1.15 * r["weights"] + ALLOWANCE, (
        f"{fmt}: loading {r['weights'] / 2**20:.0f} MiB of weights raised peak RSS by {added / 2**20:.0f} MiB "
        f"(allowed {(1.15 * r['weights'] + ALLOWANCE) / 2**20:.0f} MiB)")
    assert added >= 0.9 * r["weights"]  # the probe does see the weights
