"""The package's import graph: no cycles (module-level and function-level imports alike), no import that runs
back up (the format table at the bottom; the kernel wrappers below the weights and the loader), and the
decoder does not know about parallelism.

The graph is read from the source with ``ast`` (no import runs), so a cycle hidden behind a lazy import in a
function body is found too. ``from .x import y`` is an edge to ``x`` and, when ``x.y`` is a module, to
``x.y``; ``from . import y`` is an edge to the sibling module ``y``. Enclosing packages are no edges (Python
initialises them first); ``TYPE_CHECKING`` blocks count as well.
"""

from __future__ import annotations

import ast
from pathlib import Path

import mistral_kernels

PACKAGE = Path(mistral_kernels.__file__).resolve().parent
ROOT = "mistral_kernels"


def _modules() -> dict[str, Path]:
    """Dotted module name → file, for every .py of the package (``pkg/__init__.py`` is ``pkg``)."""
    out: dict[str, Path] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join((ROOT, *parts))] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Package modules that ``name`` imports anywhere in its source."""
    is_package = path.name == "__init__.py"
    base = name.split(".") if is_package else name.split(".")[:-1]  # package the relative import starts from
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base[:len(base) - (node.level - 1)]
                target = ".".join(anchor + (node.module.split(".") if node.module else []))
            else:
                target = node.module or ""
            if target in modules and not name.startswith(target + "."):  # not an enclosing package
                found.add(target)
            found |= {f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in modules}
    found.discard(name)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path [a, b, ..., a], or None (depth-first search, three colours)."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_graph_sees_lazy_and_relative_imports() -> None:
    graph = _graph()
    assert "mistral_kernels.ops" in graph["mistral_kernels.model"]                 # from . import ops
    assert "mistral_kernels.model" in graph["mistral_kernels.parallel.layers"]     # from ..model import ...
    assert "mistral_kernels.default_model" in graph["mistral_kernels.cli"]         # inside a function


def test_no_import_cycles() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle: " + " → ".join(cycle)


# The layers, bottom up. quant_formats: the block-format table (MK_QTYPES), importing nothing of the package.
# ops: the kernel wrappers, which import only each other, the compiled library and the table. The weights and
# the loader (the weight types, reading and packing checkpoints) import the table, never ops: a packed weight
# is handed the op namespace when it multiplies (``w.linear(x, kernels)``).
BOTTOM = "mistral_kernels.quant_formats"
OPS = "mistral_kernels.ops"
OPS_MAY_IMPORT = {"mistral_kernels._library", BOTTOM}
LOADER = {"mistral_kernels.quant_weight", "mistral_kernels.packed_moe", "mistral_kernels.config"}
LOADER_PACKAGE = "mistral_kernels.checkpoint"


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """The imports that run back up, by the rules above."""
    found = [f"{BOTTOM} imports {m}" for m in sorted(graph.get(BOTTOM, set()))]
    for name in sorted(m for m in graph if _in(m, OPS)):
        found += [f"{name} imports {m}" for m in sorted(graph[name])
                  if not _in(m, OPS) and m not in OPS_MAY_IMPORT]
    for name in sorted(m for m in graph if m in LOADER or _in(m, LOADER_PACKAGE)):
        found += [f"{name} reaches {m}" for m in sorted(_reachable(graph, name)) if _in(m, OPS)]
    return found


def test_no_import_runs_back_up() -> None:
    graph = _graph()
    assert BOTTOM in graph and "mistral_kernels.quant_weight" in graph and "mistral_kernels.ops.matmul" in graph
    assert BOTTOM in graph["mistral_kernels.quant_weight"] and BOTTOM in graph["mistral_kernels.ops.reference"]
    assert upward_imports(graph) == []


def test_upward_imports_are_reported() -> None:
    graph = _graph()
    planted = {**graph, BOTTOM: {"mistral_kernels.config"}}
    assert upward_imports(planted) == [f"{BOTTOM} imports mistral_kernels.config"]
    planted = {**graph, "mistral_kernels.ops.matmul": graph["mistral_kernels.ops.matmul"] | {
        "mistral_kernels.quant_weight"}}
    assert upward_imports(planted) == ["mistral_kernels.ops.matmul imports mistral_kernels.quant_weight"]
    # the loader's table taken from the ops package: found where it is imported and wherever it is reached from
    planted = {**graph, "mistral_kernels.packed_moe": {"mistral_kernels.ops.quant"}}
    found = upward_imports(planted)
    assert "mistral_kernels.packed_moe reaches mistral_kernels.ops.quant" in found
    assert "mistral_kernels.checkpoint.packing reaches mistral_kernels.ops.quant" in found  # via quant_weight
    assert upward_imports(graph) == []


def test_model_does_not_import_parallel() -> None:
    graph = _graph()
    for module in ("mistral_kernels.model", "mistral_kernels.batch", "mistral_kernels.config",
                   "mistral_kernels.checkpoint.base"):
        assert not {m for m in graph[module] if m.startswith("mistral_kernels.parallel")}, module


# What the checkpoint package builds on: the config, errors, the packed-weight types and the block-format table
# (quant_formats); never the model, the engine, the server or the API that load checkpoints.
_ABOVE_CHECKPOINT = ("model", "loading", "parallel", "engine", "runner", "scheduler", "batch", "cache", "sampling",
                     "output", "serve", "llm", "cli", "tokenization", "tokenizer")


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for nxt in graph[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def _above(module: str) -> bool:
    return any(module == f"{ROOT}.{m}" or module.startswith(f"{ROOT}.{m}.") for m in _ABOVE_CHECKPOINT)


def test_checkpoint_sits_below_model_and_engine() -> None:
    graph = _graph()
    package = [m for m in graph if m == f"{ROOT}.checkpoint" or m.startswith(f"{ROOT}.checkpoint.")]
    assert len(package) >= 10, package  # the package was found
    for module in package:
        bad = sorted(m for m in _reachable(graph, module) if _above(m))
        assert not bad, f"{module} imports {bad} (the checkpoint package sits below them)"
    # the loaders above it go through it: no format logic of their own
    for module in ("loading", "llm", "tokenization.load"):
        assert f"{ROOT}.checkpoint" in graph[f"{ROOT}.{module}"], module


def test_layer_check_sees_an_upward_import() -> None:
    """The rule above fails when a checkpoint module reaches the engine, directly or through another module."""
    graph = {f"{ROOT}.checkpoint.base": {f"{ROOT}.checkpoint.gguf"}, f"{ROOT}.checkpoint.gguf": {f"{ROOT}.ops"},
             f"{ROOT}.ops": {f"{ROOT}.engine"}, f"{ROOT}.engine": set()}
    assert f"{ROOT}.engine" in _reachable(graph, f"{ROOT}.checkpoint.base") and _above(f"{ROOT}.engine")
    assert not _above(f"{ROOT}.ops") and not _above(f"{ROOT}.checkpoint.gguf")



def test_scheduler_is_host_only() -> None:
    tree = ast.parse((PACKAGE / "scheduler.py").read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not {m for m in imported if m == "torch" or m.startswith("torch.")}
