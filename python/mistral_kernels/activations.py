"""The choices of how fp32 activations enter the quantized (packed) matrices' products — the rule itself is
:func:`mistral_kernels.quant_weight.quantize_x_for`; this module holds only the names, so that the command
line (:mod:`.engine_args`) can offer them without importing torch."""

from __future__ import annotations

__all__ = ["ACTIVATIONS"]

# auto: int8 for fp32 activations (llama.cpp's default); int8: always; exact: fp32 products
ACTIVATIONS = ("auto", "int8", "exact")
