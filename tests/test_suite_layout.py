"""Rules of the test suite itself: a test module never imports another test module (shared helpers and
fixtures live in tests/helpers/ or conftest.py, and helpers import no test module either), and every test
function asserts something — an ``assert``, ``pytest.raises`` / ``warns`` / ``fail``, or a call to a function
of the suite that does (``_check_prefill``, ``_run_program``, ...). Each checker is a pure function of module
sources; test_checkers_fail_on_planted_defects shows each one failing.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# calls that fail the test by themselves: pytest.raises / warns / fail, torch.library.opcheck
EXPECTING = {"raises", "warns", "fail", "deprecated_call", "opcheck"}


def _is_test_module(name: str) -> bool:
    return name.split(".")[-1].startswith("test_")


def imports_of_test_modules(sources: dict[str, str]) -> list[str]:
    """`module: imported` for each import of a test module (relative or `tests.test_x`) by a file of the suite."""
    found = []
    for where, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom):
                module = node.module or ""
                targets = [module] if module else [a.name for a in node.names]
                if (node.level or module.startswith("tests.")) and any(_is_test_module(t) for t in targets):
                    found.append(f"{where}: {'.' * node.level}{module or targets[0]}")
            elif isinstance(node, ast.Import):
                found += [f"{where}: {a.name}" for a in node.names
                          if a.name.startswith("tests.") and _is_test_module(a.name)]
    return found


def _called_names(node: ast.AST) -> set[str]:
    names = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            f = n.func
            names.add(f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else "")
    return names


def _asserts_directly(node: ast.AST) -> bool:
    if any(isinstance(n, ast.Assert) for n in ast.walk(node)):
        return True
    called = _called_names(node)
    return bool(called & EXPECTING) or any(name.startswith("assert") for name in called)


def silent_tests(sources: dict[str, str]) -> list[str]:
    """`module:line: test` for each test function that neither asserts nor calls (by name) a function of the
    suite that asserts, directly or through others."""
    functions: dict[str, list[ast.AST]] = {}
    tests: list[tuple[str, ast.FunctionDef]] = []
    for where, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.setdefault(node.name, []).append(node)
                if node.name.startswith("test_") and Path(where).name.startswith("test_"):
                    tests.append((where, node))
    asserting = {name for name, defs in functions.items() if any(_asserts_directly(d) for d in defs)}
    changed = True
    while changed:  # a function that calls an asserting function asserts
        changed = False
        for name, defs in functions.items():
            if name not in asserting and any(_called_names(d) & asserting for d in defs):
                asserting.add(name)
                changed = True
    return [f"{where}:{node.lineno}: {node.name}" for where, node in tests
            if node.name not in asserting]


SOURCES = {str(p.relative_to(TESTS)): p.read_text(encoding="utf-8") for p in sorted(TESTS.rglob("*.py"))}


def test_no_test_module_imports_another() -> None:
    assert len(SOURCES) > 50, len(SOURCES)
    problems = imports_of_test_modules(SOURCES)
    assert not problems, "move shared code to tests/helpers/ (or a conftest fixture):\n" + "\n".join(problems)


def test_every_test_asserts_something() -> None:
    problems = silent_tests(SOURCES)
    assert not problems, "tests that can only fail by crashing:\n" + "\n".join(problems)


def test_checkers_fail_on_planted_defects() -> None:
    planted = {
        "test_a.py": "from .test_b import helper\nfrom . import test_c\nimport tests.test_d\n"
                     "from tests.test_e import x\nfrom .helpers.engine import ToyModel\nfrom .conftest import TOL\n",
        "helpers/h.py": "from ..test_f import y\n",
    }
    assert imports_of_test_modules(planted) == ["test_a.py: .test_b", "test_a.py: .test_c", "test_a.py: tests.test_d",
                                            "test_a.py: tests.test_e", "helpers/h.py: ..test_f"]
    silent = {
        "helpers/checks.py": "def check_x(a):\n    assert a\n\ndef indirect(a):\n    check_x(a)\n\n"
                             "def quiet(a):\n    return a\n",
        "test_s.py": "import pytest\n\ndef test_ok():\n    assert 1\n\ndef test_raises():\n"
                     "    with pytest.raises(ValueError):\n        int('x')\n\ndef test_via_helper():\n"
                     "    indirect(1)\n\ndef test_nothing():\n    quiet(1)\n\ndef test_empty():\n    pass\n",
    }
    assert silent_tests(silent) == ["test_s.py:13: test_nothing", "test_s.py:16: test_empty"]
