"""Packed weights own their matmul: no module outside the weight types (mistral_kernels/quant_weight.py) asks a
weight whether it is packed — no ``isinstance`` / ``issubclass`` / ``type(w) is`` / ``match`` case on the
packed types (the classes quant_weight.py defines, and its ``PackedWeight`` alias), however they were
imported (module attribute, alias). The package and the benchmarks are scanned with ``ast``.

``packed_type_checks()`` scans one source text; test_scan_finds_planted_checks plants each form of the check
in a small source to show the scan catches it, and that a dense ``isinstance(w, torch.Tensor)`` passes.
"""

from __future__ import annotations

import ast
from pathlib import Path

import mistral_kernels

PACKAGE = Path(mistral_kernels.__file__).resolve().parent
WEIGHT_TYPES = PACKAGE / "quant_weight.py"
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
TYPES_MODULE = "quant_weight"  # the last part of the weight types' module name


def packed_types() -> set[str]:
    """The class names quant_weight.py defines, plus its module-level aliases of them (``PackedWeight``)."""
    tree = ast.parse(WEIGHT_TYPES.read_text())
    names = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    for n in tree.body:
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
            used = {x.id for x in ast.walk(n.value) if isinstance(x, ast.Name)}
            if used and used <= names:  # an alias made of packed types only (not ``Weight``, which has torch)
                names.add(n.targets[0].id)
    return names


def _type_names(node: ast.expr, local: dict[str, str], modules: set[str]) -> set[str]:
    """The weight-type names a class expression refers to (a name, an alias, ``module.Name``, a tuple or ``|``)."""
    found: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and n.id in local:
            found.add(local[n.id])
        elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in modules:
            found.add(n.attr)
    return found


def packed_type_checks(source: str, types: set[str]) -> list[int]:
    """Lines of ``source`` that check a value against one of ``types`` (see the module docstring)."""
    tree = ast.parse(source)
    local: dict[str, str] = {}  # local name → weight-type name
    modules: set[str] = set()  # local names bound to the weight-types module
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[-1] == TYPES_MODULE:
            local |= {a.asname or a.name: a.name for a in n.names if a.name in types}
        elif isinstance(n, (ast.ImportFrom, ast.Import)):
            modules |= {a.asname or a.name.split(".")[-1] for a in n.names if a.name.split(".")[-1] == TYPES_MODULE}
    lines = []
    for n in ast.walk(tree):
        checked: list[ast.expr] = []
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("isinstance", "issubclass") \
                and len(n.args) == 2:
            checked.append(n.args[1])
        elif isinstance(n, ast.Compare) and isinstance(n.left, ast.Call) and isinstance(n.left.func, ast.Name) \
                and n.left.func.id == "type":
            checked.extend(n.comparators)
        elif isinstance(n, ast.MatchClass):
            checked.append(n.cls)
        if any(_type_names(c, local, modules) & types for c in checked):
            lines.append(n.lineno)
    return sorted(lines)


def test_no_packed_type_checks_outside_the_weight_types() -> None:
    types = packed_types()
    assert {"QuantizedWeight", "FusedWeight", "PackedWeight"} <= types
    files = [p for p in PACKAGE.rglob("*.py") if p != WEIGHT_TYPES] + sorted(BENCHMARKS.glob("*.py"))
    assert len(files) > 40
    found = {str(p): lines for p in files if (lines := packed_type_checks(p.read_text(), types))}
    assert found == {}, f"isinstance on packed weights outside quant_weight.py (use the weight's methods): {found}"


def test_scan_finds_planted_checks() -> None:
    types = packed_types()
    planted = """
from mistral_kernels.quant_weight import FusedWeight, QuantizedWeight as QW
from mistral_kernels import quant_weight
from .. import quant_weight as qwm
import torch

def f(w, v):
    a = isinstance(w, QW)
    b = isinstance(w, (torch.Tensor, FusedWeight))
    c = isinstance(w, quant_weight.PackedWeight)
    d = type(w) is qwm.QuantizedWeight
    e = issubclass(type(w), FusedWeight | QW)
    match v:
        case QW():
            pass
    ok = isinstance(w, torch.Tensor) or type(w) is torch.Tensor
    return a, b, c, d, e, ok
"""
    assert packed_type_checks(planted, types) == [8, 9, 10, 11, 12, 14]
    assert "Weight" not in types  # Weight = torch.Tensor | PackedWeight: a check against it is no packed check
