"""Checkpoints: HF directories, Mistral consolidated directories and GGUF files, each opened once.

>>> with Checkpoint.open("SmolLM2-135M-Instruct.Q4_1.gguf") as ckpt:          # doctest: +SKIP
...     ckpt.format, ckpt.config.n_layers, ckpt.default_dtype("cpu")
...     weights = ckpt.load("cpu")                      # fused weights; quantized matrices stay packed
('gguf', 30, torch.float32)

The format is decided by what the path contains (docs/design.md §6), never by names:

==================  =============================================  ===========
format              detected by                                    config
==================  =============================================  ===========
``hf``              directory with ``config.json`` + safetensors   config.json
``consolidated``    directory with ``params.json`` +               params.json
                    ``consolidated*.safetensors``
``gguf``            file starting with the bytes ``GGUF``          metadata
==================  =============================================  ===========

Modules: one per format — :mod:`.hf`, :mod:`.consolidated`, :mod:`.gguf` (detection, config parsing,
renaming rules, packed readers; :mod:`.gguf_header` parses a GGUF header) — implementing :mod:`.format`, and
the shared steps: :mod:`.source` (files opened once, the tensor source), :mod:`.tensor_io` (headers validated,
data read or mapped), :mod:`.fields` (range-checked config fields), :mod:`.naming` (canonical names and
checks), :mod:`.fusion` (fused weights), :mod:`.packing` (which weights stay packed), :mod:`.footprint` (bytes
once loaded), :mod:`.base` (:class:`Checkpoint`, the list of formats). This package imports nothing above the
model config and the packed-weight types: the model, the engine and the server build on it.
"""

from ..errors import CheckpointError, UnsupportedCheckpointError
from .base import FORMATS, Checkpoint, QuantizedFallbackWarning, load_checkpoint, load_config, opened
from .footprint import WeightFootprint
from .naming import expected_shapes
from .packing import QUANTIZE_CHOICES, PackingPlan

__all__ = ["FORMATS", "QUANTIZE_CHOICES", "Checkpoint", "CheckpointError", "PackingPlan", "QuantizedFallbackWarning",
           "UnsupportedCheckpointError", "WeightFootprint", "expected_shapes", "load_checkpoint", "load_config",
           "opened"]
