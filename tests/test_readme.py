"""The README as documentation that stays true: its op examples run as written, its `generate` flag table
lists every flag of the CLI, and the relative links of the README and docs/ point at files that exist.
(The model / generation examples are covered by test_smollm2.py and test_cli.py, which load the same default
model.)"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import torch

from mistral_kernels.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TEXT = README.read_text(encoding="utf-8")
BLOCKS = re.findall(r"```python\n(.*?)```", TEXT, re.S)
OP_BLOCKS = [b for b in BLOCKS if "from mistral_kernels import ops" in b]
DOCS = [README, *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "benchmarks" / "results").glob("*.md"))]


def test_readme_has_op_examples() -> None:
    assert len(OP_BLOCKS) >= 3, "README lost its op examples (norm/RoPE, attention, MoE)"


@pytest.mark.parametrize("index", range(len(OP_BLOCKS)))
def test_readme_op_example_runs(index: int) -> None:
    namespace: dict[str, object] = {}
    exec(compile(OP_BLOCKS[index], f"README.md python block {index}", "exec"), namespace)
    results = [v for v in namespace.values() if isinstance(v, torch.Tensor)]
    assert results and all(torch.isfinite(t.float()).all() for t in results if t.is_floating_point()), \
        f"README python block {index} produced no tensor or a non-finite one"


def _subcommand(name: str) -> argparse.ArgumentParser:
    subparsers = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return subparsers[0].choices[name]


def test_generate_flags_are_in_the_readme_table() -> None:
    flags = {s for action in _subcommand("generate")._actions for s in action.option_strings
             if s.startswith("--") and s != "--help"}
    assert len(flags) > 20, flags
    section = TEXT.split("`mistral-kernels generate` flags:", 1)
    assert len(section) == 2, "README lost the `mistral-kernels generate` flags table"
    rows = re.findall(r"^\| `(--[a-z0-9-]+)", section[1], re.M)
    assert sorted(set(rows)) == sorted(flags), "README flag table vs `mistral-kernels generate --help`"


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_relative_links_resolve(doc: Path) -> None:
    text = doc.read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    for link in links:
        if re.match(r"[a-z]+://", link) or link.startswith("#"):
            continue
        target = (doc.parent / link.split("#", 1)[0]).resolve()
        assert target.exists(), f"{doc.name}: link {link} -> {target} does not exist"
    assert not re.search(r"\bissue \d", text, re.I), f"{doc.name} refers to an issue number"
    assert "DESIGN.md" not in text, f"{doc.name}: the design notes are docs/design.md"
