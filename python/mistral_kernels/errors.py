"""The one exception of checkpoint loading.

Every defect of a checkpoint — unknown format, unreadable or truncated file, corrupt header, a config field out
of range, tensors missing / unexpected / mis-shaped / integer-typed — raises :class:`CheckpointError` with a
message naming the file and the field or tensor. :class:`UnsupportedCheckpointError` (a well-formed checkpoint
of a model this package does not implement) is a subclass.
"""

from __future__ import annotations

__all__ = ["CheckpointError", "UnsupportedCheckpointError"]


class CheckpointError(ValueError):
    """The checkpoint cannot be loaded; the message names the file and what is wrong with it."""


class UnsupportedCheckpointError(CheckpointError):
    """The checkpoint describes a model this package does not implement (bias, rope scaling, ...)."""
