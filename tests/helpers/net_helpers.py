"""Helpers of the tests that start servers or process groups: a free local port, waiting for /health."""

from __future__ import annotations

import socket
import subprocess
import time


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(proc: subprocess.Popen[str], url: str, timeout: float = 120.0) -> None:
    """Poll ``url``/health until it answers 200; fail with the process output if it exits or time runs out."""
    import httpx  # the test extra

    deadline = time.time() + timeout
    while True:
        assert proc.poll() is None, proc.communicate()[0]
        try:
            if httpx.get(url + "/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.time() < deadline, "the server did not come up"
        time.sleep(0.2)
