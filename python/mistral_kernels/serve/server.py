"""``mistral-kernels serve``: load the model, run the app under uvicorn, shut down gracefully.

SIGINT / SIGTERM: stop accepting connections, answer new requests 503, let in-flight requests finish
(at most ``--shutdown-timeout`` seconds; then the engine aborts them and each response ends properly: a
stream with a ``finish_reason: "abort"`` chunk, an error event and ``[DONE]``, a plain request with a 503),
stop the engine loop, exit 0. uvicorn itself cancels what is left :data:`_FLUSH_SECONDS` later.

``--tp N`` under torchrun: every rank loads its shard; rank 0 listens and broadcasts its engine operations,
the other ranks follow them (:mod:`.tp`); every rank exits 0 after a shutdown signal.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import uvicorn

from ..engine_args import EngineArgs
from ..llm import LLM
from ..parallel import ParallelContext
from .app import build_app
from .tp import EngineMirror, control_group, follow

__all__ = ["serve_main"]


_FLUSH_SECONDS = 2.0  # after the cut, the time responses have to send their last bytes


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


def serve_main(args: argparse.Namespace, parallel: ParallelContext | None = None, device: str | None = None) -> int:
    """Serve until SIGINT / SIGTERM; ``parallel``: this process is one rank of ``--tp N`` (device: its own)."""
    rank = parallel.rank if parallel is not None else 0
    tp = parallel is not None and parallel.world_size > 1
    prefix = f"mistral-kernels serve[rank {rank}]" if tp else "mistral-kernels serve"
    group = None
    if tp:
        import torch.distributed as dist

        group = control_group(dist.get_backend())
    try:
        kwargs = EngineArgs.from_cli_args(args).to_llm_kwargs()
        llm = LLM(**{**kwargs, "device": device or kwargs["device"]}, parallel=parallel)
    except (RuntimeError, ValueError, FileNotFoundError, ImportError) as e:
        print(f"{prefix}: cannot load the model: {e}", file=sys.stderr)
        return 2
    if tp and rank > 0:
        follow(llm.engine, group, rank)
        print(f"{prefix}: stopped", file=sys.stderr, flush=True)
        return 0
    name = args.served_model_name or Path(llm.path).name
    app = build_app(llm, name, max_waiting=args.max_waiting, mirror=EngineMirror(group) if tp else None,
                    max_request_bytes=args.max_request_bytes)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning",
                            timeout_graceful_shutdown=args.shutdown_timeout + _FLUSH_SECONDS)
    engine = app.state.server.engine
    server = _Server(config, lambda: engine.begin_shutdown(cut_after=args.shutdown_timeout))
    print(f"mistral-kernels serve: '{name}' on http://{args.host}:{args.port} (load {llm.load_seconds:.1f} s; "
          f"{llm.sizes.describe()})", file=sys.stderr, flush=True)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _exit_zero)
    try:
        server.run()
    except SystemExit as e:
        code = int(e.code or 0)
    else:
        code = 0
    if tp:
        print(f"{prefix}: stopped", file=sys.stderr, flush=True)
    return code
