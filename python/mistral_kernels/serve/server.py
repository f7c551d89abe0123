"""``mistral-kernels serve``: load the model, run the app under uvicorn, shut down gracefully.

SIGINT / SIGTERM: stop accepting connections, answer new requests 503, let in-flight requests finish
(at most ``--shutdown-timeout`` seconds, then they are cancelled and aborted), stop the engine loop, exit 0.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import torch
import uvicorn

from ..llm import LLM
from .app import build_app

__all__ = ["serve_main"]


class _Server(uvicorn.Server):
    """uvicorn's server, telling the engine to refuse new requests as soon as a shutdown signal arrives."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._on_exit()
        super().handle_exit(sig, frame)


def _exit_zero(sig: int, frame: FrameType | None) -> None:
    # uvicorn re-raises the signal that stopped it once it has shut down; after a graceful shutdown that
    # is a normal exit.
    raise SystemExit(0)


def serve_main(args: argparse.Namespace, dtype: torch.dtype | None) -> int:
    if args.tp > 1:
        print("mistral-kernels serve: --tp > 1 is not supported yet; serve one process (--tp 1)", file=sys.stderr)
        return 2
    try:
        llm = LLM(args.model, device=args.device, dtype=dtype, max_batch=args.max_batch,
                  block_size=args.block_size, num_blocks=args.num_blocks,
                  max_tokens_per_step=args.max_tokens_per_step, tokenizer=args.tokenizer,
                  prefix_caching=args.enable_prefix_caching, enforce_eager=args.enforce_eager)
    except (RuntimeError, ValueError, FileNotFoundError, ImportError) as e:
        print(f"mistral-kernels serve: cannot load the model: {e}", file=sys.stderr)
        return 2
    name = args.served_model_name or Path(llm.path).name
    app = build_app(llm, name, max_waiting=args.max_waiting)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning",
                            timeout_graceful_shutdown=args.shutdown_timeout)
    server = _Server(config, app.state.server.engine.begin_shutdown)
    print(f"mistral-kernels serve: '{name}' on http://{args.host}:{args.port} (load {llm.load_seconds:.1f} s)",
          file=sys.stderr, flush=True)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _exit_zero)
    try:
        server.run()
    except SystemExit as e:
        return int(e.code or 0)
    return 0
