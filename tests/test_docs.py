"""The docs and comments stay true to the tree: every repository path, file name and ``mistral_kernels.x``
name they cite exists; docs/design.md §2 names every module and source file; §3's op table lists exactly the
schemas of csrc/registration.cpp; no text refers to a tracker number ("issue 12") instead of saying what it
means. Each checker is a pure function of texts / file lists, and test_checkers_fail_on_planted_defects feeds
it a planted defect to show it can fail.
"""

from __future__ import annotations

import fnmatch
import re
import subprocess
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "python" / "mistral_kernels"
DESIGN = ROOT / "docs" / "design.md"
TEXT_SUFFIXES = (".py", ".md", ".sh", ".cpp", ".h", ".cuh", ".cu", ".toml", ".txt", ".cmake")

# A repository path (`csrc/kernels/norm.cuh`, `benchmarks/results/gpu_*.md`, `ops/<family>.py`) or a module path
# relative to the package (`mistral_kernels/ops/quant.py`, `serve/app.py`).
PATH_RE = re.compile(
    r"(?<![\w./-])((?:csrc|python|tests|scripts|benchmarks|docs|cmake)/[\w./*<>-]*[\w*>]"
    r"|(?:mistral_kernels|ops|serve|tokenization|parallel|checkpoint)/[\w/<>*.-]*\.py)"
)
# A bare source file name (`weights.py`, `quant_blocks.h`).
NAME_RE = re.compile(r"(?<![\w./<>*-])([A-Za-z_][\w-]*\.(?:py|cuh|cu|cpp|h|sh|toml))\b")
# Files named in the tree that are not ours: CUDA toolkit headers, llama.cpp, files of other projects.
EXTERNAL_NAMES = {"cuda_bf16.h", "cuda_fp16.h", "driver_types.h", "host_defines.h", "llama.cpp", "wheel.py",
                  "kernel.cuh"}
DOTTED_RE = re.compile(r"(?<![\w.])mistral_kernels(?:\.\w+)+")
ISSUE_RE = re.compile(r"\bissues? #?\d+", re.I)


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [f for f in out.splitlines() if (ROOT / f).is_file()]


def text_files(files: Iterable[str]) -> list[str]:
    return [f for f in files if f.endswith(TEXT_SUFFIXES) or Path(f).name == "CMakeLists.txt"]


def _path_exists(root: Path, cited: str) -> bool:
    if cited.startswith("mistral_kernels/"):
        cited = "python/" + cited
    elif cited.startswith(("ops/", "serve/", "tokenization/", "parallel/", "checkpoint/")):
        cited = "python/mistral_kernels/" + cited
    pattern = re.sub(r"<[^>]*>", "*", cited)
    if "*" in pattern:
        return any(root.glob(pattern)) or ("*" not in pattern.rsplit("/", 1)[0]
                                           and (root / pattern.rsplit("/", 1)[0]).is_dir())
    return (root / pattern).exists()


def missing_paths(root: Path, texts: dict[str, str], names: set[str]) -> list[str]:
    """`file:line: cited` for each cited path or file name that does not exist (names: every tracked file name)."""
    found = []
    for where, text in texts.items():
        for m in PATH_RE.finditer(text):
            cited = m.group(1).rstrip(".")
            if not _path_exists(root, cited):
                found.append(f"{where}:{text.count(chr(10), 0, m.start()) + 1}: {cited}")
        for m in NAME_RE.finditer(text):
            if m.group(1) not in names and m.group(1) not in EXTERNAL_NAMES:
                found.append(f"{where}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(1)}")
    return found


def _module_source(package: Path, dotted: str) -> bool:
    """Whether ``mistral_kernels.a.b.name`` resolves: modules by their files, the first non-module part by a
    name in the last module's source (defined, imported or assigned)."""
    parts = dotted.split(".")[1:]
    here, source = package, package / "__init__.py"
    for i, part in enumerate(parts):
        if part.startswith("__") and part.endswith("__"):
            return True
        if (here / part / "__init__.py").exists():
            here, source = here / part, here / part / "__init__.py"
            continue
        if (here / f"{part}.py").exists():
            rest = parts[i + 1:]
            return not rest or re.search(rf"\b{rest[0]}\b", (here / f"{part}.py").read_text()) is not None
        return re.search(rf"\b{part}\b", source.read_text()) is not None
    return True


def unresolved_names(package: Path, texts: dict[str, str]) -> list[str]:
    found = []
    for where, text in texts.items():
        for m in DOTTED_RE.finditer(text):
            if not _module_source(package, m.group(0)):
                found.append(f"{where}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}")
    return found


def issue_references(texts: dict[str, str]) -> list[str]:
    return [f"{where}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
            for where, text in texts.items() for m in ISSUE_RE.finditer(text)]


# ---- docs/design.md §2 and §3 ------------------------------------------------------------------------------

def section(text: str, number: int) -> str:
    match = re.search(rf"^## {number}\. .*?(?=^## \d+\. |\Z)", text, re.S | re.M)
    assert match, f"docs/design.md has no section {number}"
    return match.group(0)


def layout_block(design: str) -> str:
    blocks = re.findall(r"```\n(.*?)```", section(design, 2), re.S)
    assert blocks, "docs/design.md §2 lost its layout block"
    return blocks[0]


def python_entries(block: str) -> dict[str, str]:
    """The python/mistral_kernels/ part of the layout: subpackage (or "" for the top level) → the text of its
    entries. An entry starts at a line indented by two spaces and runs over the lines indented further; an
    entry whose first word ends in "/" describes that subpackage."""
    lines = block.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("python/mistral_kernels/"))
    entries: dict[str, str] = {"": ""}
    current = ""
    for line in lines[start + 1:]:
        if line and not line.startswith(" "):
            break
        if re.match(r"  \S", line):
            first = line.split()[0]
            current = first.rstrip("/") if first.endswith("/") else ""
            entries.setdefault(current, "")
        entries[current] += line + "\n"
    return entries


def unnamed_modules(package: Path, block: str) -> list[str]:
    """Modules of the package the layout does not name: a top-level module by its file name in a top-level
    entry, a subpackage's module by its file name in that subpackage's entry."""
    entries = python_entries(block)
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if path.name == "__init__.py" or "__pycache__" in rel.parts:
            continue
        sub = "/".join(rel.parts[:-1])
        if not re.search(rf"(?<![\w/.]){re.escape(path.name)}\b", entries.get(sub, "")):
            found.append(str(rel))
    return found


def families(block: str) -> set[str]:
    match = re.search(r"op families: ([\w ,]+)", block)
    assert match, "docs/design.md §2 lost its `op families:` line"
    return {f.strip() for f in match.group(1).split(",")}


FAMILY_DIRS = ("checks", "glue", "cuda", "emu")


def unnamed_sources(csrc: Path, block: str, simt_readme: str) -> list[str]:
    """Files under csrc/ the layout does not name. A file is named by its file name or a glob that matches
    it (`emu_fiber.*`, `vec_math*.h`; not a bare `*.cuh`); a file of checks/, glue/, cuda/ and emu/ by its
    op family in the `op families:` line; a file of simt/ may instead be named in csrc/simt/README.md; every
    directory by `name/`."""
    words = set(re.findall(r"[\w.*-]+", block))
    globs = {w for w in words if "*" in w and not w.startswith("*") and "." in w}
    fams = families(block)
    simt_words = set(re.findall(r"[\w.*-]+", simt_readme))
    found = []
    for path in sorted(csrc.rglob("*")):
        rel = path.relative_to(csrc)
        if path.is_dir():
            if f"{path.name}/" not in block:
                found.append(f"{rel}/")
            continue
        name = path.name
        if name in words or any(fnmatch.fnmatch(name, g) for g in globs):
            continue
        if rel.parts[0] in FAMILY_DIRS and path.stem in fams:
            continue
        if rel.parts[0] == "simt" and (name in simt_words
                                       or any(fnmatch.fnmatch(name, w) for w in simt_words if "*" in w)):
            continue
        found.append(str(rel))
    return found


def schema_names(registration: str) -> set[str]:
    return set(re.findall(r'^\s*"(\w+)\(', registration, re.M))


def op_table_names(design: str) -> list[str]:
    return re.findall(r"^\| `(\w+)", section(design, 3), re.M)


# ---- the tests --------------------------------------------------------------------------------------------

FILES = tracked_files()
# Files whose planted defects (bad paths, tracker numbers) are test data.
PLANTED = {"tests/test_docs.py", "tests/test_suite_layout.py", "tests/test_benchmarks_layout.py"}
TEXTS = {f: (ROOT / f).read_text(encoding="utf-8", errors="replace") for f in text_files(FILES) if f not in PLANTED}
NAMES = {Path(f).name for f in FILES}
DESIGN_TEXT = DESIGN.read_text(encoding="utf-8")


def test_cited_paths_exist() -> None:
    assert len(TEXTS) > 200, len(TEXTS)
    problems = missing_paths(ROOT, TEXTS, NAMES)
    assert not problems, "cited paths / file names that do not exist:\n" + "\n".join(problems)


def test_cited_module_names_resolve() -> None:
    problems = unresolved_names(PKG, TEXTS)
    assert not problems, "cited mistral_kernels names that do not exist:\n" + "\n".join(problems)


def test_no_issue_numbers() -> None:
    problems = issue_references(TEXTS)
    assert not problems, "say what a tracker reference meant instead:\n" + "\n".join(problems)


def test_layout_names_every_module() -> None:
    problems = unnamed_modules(PKG, layout_block(DESIGN_TEXT))
    assert not problems, "modules without a line in docs/design.md §2:\n" + "\n".join(problems)


def test_layout_names_every_source_file() -> None:
    simt = (ROOT / "csrc" / "simt" / "README.md").read_text(encoding="utf-8")
    problems = unnamed_sources(ROOT / "csrc", layout_block(DESIGN_TEXT), simt)
    assert not problems, "csrc files without a line in docs/design.md §2:\n" + "\n".join(problems)


def test_op_table_lists_every_schema() -> None:
    schemas = schema_names((ROOT / "csrc" / "registration.cpp").read_text(encoding="utf-8"))
    assert len(schemas) >= 16, schemas
    rows = op_table_names(DESIGN_TEXT)
    assert len(rows) == len(set(rows)), f"op table rows repeat: {rows}"
    assert set(rows) == schemas, (f"docs/design.md §3 op table vs csrc/registration.cpp: missing "
                                  f"{sorted(schemas - set(rows))}, not a schema {sorted(set(rows) - schemas)}")


def test_checkers_fail_on_planted_defects(tmp_path: Path) -> None:
    planted = {"x.md": "see `csrc/kernels/no_such_kernel.cuh` and mistral_kernels/nowhere.py, gone.py\n"}
    assert [p.rsplit(": ", 1)[1] for p in missing_paths(ROOT, planted, NAMES)] == [
        "csrc/kernels/no_such_kernel.cuh", "mistral_kernels/nowhere.py", "gone.py"]
    assert missing_paths(ROOT, {"ok.md": "csrc/kernels/common.cuh, ops/<family>.py, engine.py"}, NAMES) == []
    assert unresolved_names(PKG, {"x.py": "mistral_kernels.ops.no_such_op, mistral_kernels.nothing"}) == [
        "x.py:1: mistral_kernels.ops.no_such_op", "x.py:1: mistral_kernels.nothing"]
    assert unresolved_names(PKG, {"ok.py": "mistral_kernels.ops.rms_norm mistral_kernels.engine.Engine"}) == []
    assert issue_references({"x.py": "# fixed in issue 7\n# Issue #12 item 3\n# no issue here"}) == [
        "x.py:1: issue 7", "x.py:2: Issue #12"]

    block = layout_block(DESIGN_TEXT)
    (tmp_path / "ops").mkdir()
    for name in ("engine.py", "ops/norm.py", "ops/brand_new.py", "brand_new_top.py"):
        (tmp_path / name).write_text("")
    assert unnamed_modules(tmp_path, block) == ["brand_new_top.py", "ops/brand_new.py"]
    # a top-level name in a subpackage's entry (or the reverse) does not count
    assert unnamed_modules(tmp_path, "python/mistral_kernels/\n  ops/ brand_new_top.py norm.py\n"
                                     "  engine.py ops/brand_new.py\n") == ["brand_new_top.py", "ops/brand_new.py"]

    csrc = tmp_path / "csrc"
    for name in ("registration.cpp", "kernels/brand_new.cuh", "glue/norm.h", "glue/new_family.h",
                 "simt/emu_new.cpp", "new_dir/x.h"):
        (csrc / name).parent.mkdir(parents=True, exist_ok=True)
        (csrc / name).write_text("")
    assert unnamed_sources(csrc, block.replace("emu*.h / emu*.cpp", ""), "") == [
        "glue/new_family.h", "kernels/brand_new.cuh", "new_dir/", "new_dir/x.h", "simt/emu_new.cpp"]

    design = DESIGN_TEXT.replace("| `moe_qgemm", "| `moe_qgemx")
    assert set(op_table_names(design)) != schema_names((ROOT / "csrc" / "registration.cpp").read_text())
