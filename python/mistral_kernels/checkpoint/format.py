"""What a checkpoint format supplies: :class:`Format`, implemented once per format (:mod:`.hf`,
:mod:`.consolidated`, :mod:`.gguf`) and listed in :data:`mistral_kernels.checkpoint.base.FORMATS`.

A format detects itself from a :class:`~mistral_kernels.checkpoint.source.Probe` (what the path contains),
reads its config and tensor headers once (:meth:`Format.read` → :class:`Contents`), states its renaming
rules to the canonical names (:mod:`.naming`), and reads packed blocks where it stores them. Everything
else — dtype, fusion, packing, footprint, loading — is shared (:class:`~mistral_kernels.checkpoint.Checkpoint`).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from ..config import ModelConfig
from ..quant_weight import PackedWeight
from .naming import Rule
from .source import Probe, TensorSource
from .tensor_io import TensorInfo

__all__ = ["Contents", "Format", "TokenizerSource"]

# Where the tokenizer is: a file or directory for load_tokenizer, or a GGUF's metadata (tokenizer.ggml.*)
TokenizerSource = Path | Mapping[str, Any]


@dataclass
class Contents:
    """A checkpoint as its format read it (headers only).

    config : the model config
    source : the tensors under the file's own names, files held open
    stated_dtype : the dtype the config states (config.json's ``dtype``), None when it states none
    tokenizer : where the tokenizer is (:data:`TokenizerSource`)
    """

    config: ModelConfig
    source: TensorSource
    tokenizer: TokenizerSource
    stated_dtype: torch.dtype | None = None


class Format(ABC):
    """One checkpoint format. Subclasses set the class attributes and implement :meth:`detect`, :meth:`read`."""

    name: ClassVar[str]                 # "hf", "consolidated", "gguf"
    expects: ClassVar[str]              # what the path must hold, for messages ("config.json + *.safetensors")
    is_file: ClassVar[bool]             # a single file (True) or a directory (False)
    rules: ClassVar[Sequence[Rule]]     # file tensor names → canonical names (:mod:`.naming`)
    ignored: ClassVar[re.Pattern[str]]  # file tensors that are not weights of the decoder

    @abstractmethod
    def detect(self, probe: Probe) -> bool:
        """Whether the probed path is in this format (from its contents, never its name)."""

    @abstractmethod
    def read(self, probe: Probe) -> Contents:
        """Config and tensor headers of the probed path (a file's descriptor is taken from the probe).

        Raises CheckpointError naming the file and field for anything unreadable or out of range."""

    def read_packed(self, stored: Sequence[TensorInfo], shape: tuple[int, ...], source: TensorSource,
                    device: torch.device | str) -> PackedWeight:
        """The matrix ``shape`` made of ``stored`` (in row order) kept in its stored block formats; called
        only for the matrices :func:`~mistral_kernels.checkpoint.packing.packing_plan` marks packed."""
        raise NotImplementedError(f"{self.name} checkpoints store no packed blocks")
