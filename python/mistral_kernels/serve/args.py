"""The ``mistral-kernels serve`` flags of the server itself (no dependency on the ``serve`` extra, so ``--help``
always works); the engine flags are :class:`~mistral_kernels.engine_args.EngineArgs`', as for ``generate``."""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["DEFAULT_MAX_REQUEST_BYTES", "add_serve_arguments"]

DEFAULT_MAX_REQUEST_BYTES = 1 << 20  # 1 MiB: about 8× the text of a full 32k-token context (~4 bytes a token)


def add_serve_arguments(p: argparse.ArgumentParser, positive: Callable[[type], object]) -> None:
    """Add the server's flags: address, served name, queue limit, body size limit, shutdown timeout."""
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (8000; 0 = any free port)")
    p.add_argument("--served-model-name", help="model name clients must send (default: the model file or "
                                               "directory name)")
    p.add_argument("--max-waiting", type=positive(int), default=256,
                   help="requests queued beyond the running batch before new ones get 503 (256)")
    p.add_argument("--max-request-bytes", type=positive(int), default=DEFAULT_MAX_REQUEST_BYTES,
                   help=f"largest request body in bytes; a larger one gets 413 ({DEFAULT_MAX_REQUEST_BYTES} = 1 MiB)")
    p.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="seconds in-flight requests may take to finish after SIGINT / SIGTERM; then they are cut: "
                        "a stream ends with finish_reason \"abort\", an error event and [DONE] (30)")
