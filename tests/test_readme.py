"""The README's op examples run as written (the model / generation examples are covered by
test_smollm2.py and test_cli.py, which load the same default model)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
OP_BLOCKS = [b for b in BLOCKS if "from mistral_kernels import ops" in b]


def test_readme_has_op_examples() -> None:
    assert len(OP_BLOCKS) >= 3, "README lost its op examples (norm/RoPE, attention, MoE)"


@pytest.mark.parametrize("index", range(len(OP_BLOCKS)))
def test_readme_op_example_runs(index: int) -> None:
    exec(compile(OP_BLOCKS[index], f"README.md python block {index}", "exec"), {})
