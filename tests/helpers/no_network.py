"""A pytest plugin for runs that must need no network (scripts/gpu_check.sh: ``pytest -p tests.helpers.no_network``):
a socket connection beyond the loopback interface and a ``pip download`` / ``pip install`` subprocess raise at
once, naming what tried, instead of waiting on retries and timeouts of a machine with no network.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import subprocess
from collections.abc import Callable
from typing import Any

import pytest

__all__ = ["NetworkUsed", "install"]


class NetworkUsed(RuntimeError):
    """Raised where a test reaches for the network in a run that must not."""


def _loopback(address: Any) -> bool:
    if not isinstance(address, tuple) or not address:
        return True  # AF_UNIX paths and the like: local
    host = address[0]
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: resolved elsewhere, not here
        return False


def _pip_network_call(args: Any) -> bool:
    argv = [str(a) for a in args] if isinstance(args, (list, tuple)) else str(args).split()
    return any(re.fullmatch(r"pip[0-9.]*", a.rsplit("/", 1)[-1]) for a in argv) and \
        any(a in ("download", "install") for a in argv)


def install() -> Callable[[], None]:
    """Patch socket connects and subprocess.Popen; returns the undo."""
    connect, connect_ex, popen_init = socket.socket.connect, socket.socket.connect_ex, subprocess.Popen.__init__

    def guarded_connect(self: socket.socket, address: Any) -> Any:
        if not _loopback(address):
            raise NetworkUsed(f"network access in an offline run: connect to {address!r}")
        return connect(self, address)

    def guarded_connect_ex(self: socket.socket, address: Any) -> Any:
        if not _loopback(address):
            raise NetworkUsed(f"network access in an offline run: connect_ex to {address!r}")
        return connect_ex(self, address)

    def guarded_popen(self: subprocess.Popen, args: Any, *a: Any, **kw: Any) -> None:
        if _pip_network_call(args):
            raise NetworkUsed(f"pip reaches for the network in an offline run: {args!r}")
        popen_init(self, args, *a, **kw)

    socket.socket.connect, socket.socket.connect_ex = guarded_connect, guarded_connect_ex
    subprocess.Popen.__init__ = guarded_popen

    def undo() -> None:
        socket.socket.connect, socket.socket.connect_ex = connect, connect_ex
        subprocess.Popen.__init__ = popen_init

    return undo


def pytest_configure(config: pytest.Config) -> None:
    config.add_cleanup(install())
