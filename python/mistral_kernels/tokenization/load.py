""":func:`load_tokenizer`: the tokenizer kind is decided by what the file contains, never by its name."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from ..checkpoint import Checkpoint
from .base import Tokenizer
from .hf import load_hf_json
from .mistral import MistralCommonTokenizer


def _is_gguf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def load_tokenizer(path: str | Path | Checkpoint) -> Tokenizer:
    """Load a tokenizer from a file, a model directory or an open checkpoint.

    Parameters
    ----------
    path : str, Path or Checkpoint
        One of: an open :class:`~mistral_kernels.checkpoint.Checkpoint` (its
        :meth:`~mistral_kernels.checkpoint.Checkpoint.tokenizer_source`: a GGUF's header already read, or the
        checkpoint directory); a ``.gguf`` file (tokenizer built from its metadata); an HF ``tokenizer.json``
        (its folder's tokenizer_config.json / chat_template.jinja / generation_config.json are read too); a
        mistral-common ``tekken.json`` or SentencePiece ``tokenizer.model[.vN]``; or a directory holding one
        of those (searched in that order: tokenizer.json, tekken.json, tokenizer.model*, a single *.gguf).

    Returns
    -------
    Tokenizer

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist or the directory holds no tokenizer.
    ValueError
        The file is not a tokenizer this function knows.
    """
    if isinstance(path, Checkpoint):
        source = path.tokenizer_source()
        if isinstance(source, Mapping):
            from .gguf import gguf_tokenizer

            return gguf_tokenizer(source, path.path)
        path = source
    p = Path(path)
    if p.is_dir():
        candidates = [p / "tokenizer.json", p / "tekken.json", *sorted(p.glob("tokenizer.model*")),
                      *sorted(p.glob("*.gguf"))]
        found = [c for c in candidates if c.is_file()]
        if not found:
            raise FileNotFoundError(
                f"load_tokenizer: no tokenizer in directory {p} (looked for tokenizer.json, tekken.json, "
                "tokenizer.model*, *.gguf)")
        p = found[0]
    if not p.is_file():
        raise FileNotFoundError(f"load_tokenizer: path {p} does not exist")
    if _is_gguf(p):
        from .gguf import load_gguf_tokenizer

        return load_gguf_tokenizer(p)
    with open(p, "rb") as f:
        first = f.read(1)
    if first == b"{":
        data = json.loads(p.read_text(encoding="utf-8"))
        if isinstance(data, dict) and "model" in data and "pre_tokenizer" in data:
            return load_hf_json(p)
        if isinstance(data, dict) and "vocab" in data and "config" in data:  # tekken.json
            return MistralCommonTokenizer(p)
        raise ValueError(f"load_tokenizer: {p} is JSON but neither an HF tokenizer.json nor a tekken.json")
    # Otherwise a SentencePiece protobuf model (mistral-common names them tokenizer.model.v1/v2/v3/v7...).
    return MistralCommonTokenizer(p)
