"""Benchmarks as code: every script builds its parser and picks dtypes through benchmarks/common.py
(``bench_parser``, ``DTYPES`` / ``dtypes``), every result file is named ``<device>_<area>[_<variant>].md``
(device ``cpu`` or ``gpu``) and names the command that produced it. The checkers are pure functions of file
names and texts; test_checkers_fail_on_planted_defects shows each one failing.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
RESULTS = BENCH / "results"
# Rewritten on another line of work at the same time; they join the shared parser when that lands.
PENDING = {"bench_llamacpp.py", "bench_cpu_kernels.py"}

NAME_RE = re.compile(r"^(cpu|gpu)_[a-z0-9]+(?:_[a-z0-9]+)*\.md$")
COMMAND_RE = re.compile(r"(?:python[0-9.]*|bash) ((?:benchmarks|scripts)/[\w/]+\.(?:py|sh))")
DTYPE_LITERAL_RE = re.compile(r"\{\s*\"(?:fp32|fp16|bf16)\":\s*torch\.")


def badly_named(names: list[str]) -> list[str]:
    return [n for n in names if not NAME_RE.match(n)]


def results_without_command(root: Path, texts: dict[str, str]) -> list[str]:
    """Result files that name no command (`python benchmarks/x.py ...`) of an existing script."""
    return [name for name, text in texts.items()
            if not any((root / m).is_file() for m in COMMAND_RE.findall(text))]


def scripts_off_the_shared_parser(texts: dict[str, str]) -> list[str]:
    found = []
    for name, text in texts.items():
        if "__main__" not in text:
            continue
        if "argparse.ArgumentParser(" in text or "bench_parser(" not in text:
            found.append(f"{name}: its own argparse.ArgumentParser (use common.bench_parser)")
        if DTYPE_LITERAL_RE.search(text):
            found.append(f"{name}: its own dtype map (use common.DTYPES / dtypes)")
    return found


def test_result_files_follow_the_naming_scheme() -> None:
    names = sorted(p.name for p in RESULTS.glob("*.md"))
    assert len(names) > 10, names
    assert not badly_named(names), f"rename (git mv) to <cpu|gpu>_<area>[_<variant>].md: {badly_named(names)}"


def test_result_files_name_their_command() -> None:
    texts = {p.name: p.read_text(encoding="utf-8") for p in sorted(RESULTS.glob("*.md"))}
    problems = results_without_command(ROOT, texts)
    assert not problems, f"add a `Command: `python benchmarks/...`` line (common.command_line): {problems}"


def test_scripts_share_the_parser_and_dtype_map() -> None:
    texts = {p.name: p.read_text(encoding="utf-8") for p in sorted(BENCH.glob("*.py"))
             if p.name != "common.py" and p.name not in PENDING}
    assert len(texts) > 10, sorted(texts)
    problems = scripts_off_the_shared_parser(texts)
    assert not problems, "\n".join(problems)


def test_checkers_fail_on_planted_defects() -> None:
    assert badly_named(["cpu_ops_bf16.md", "bench_ops_bf16.md", "quant_cpu.md", "gpu_kernels.md", "cpu.md"]) == [
        "bench_ops_bf16.md", "quant_cpu.md", "cpu.md"]
    assert results_without_command(ROOT, {
        "a.md": "Command: `python benchmarks/bench_ops.py --dtype bf16`",
        "b.md": "copy bandwidth 38 GB/s",
        "c.md": "Command: `python benchmarks/bench_gone.py`",
    }) == ["b.md", "c.md"]
    assert scripts_off_the_shared_parser({
        "ok.py": "ap = bench_parser(__doc__)\nif __name__ == '__main__':\n    main()\n",
        "own.py": "ap = argparse.ArgumentParser()\nif __name__ == '__main__':\n    main()\n",
        "map.py": 'ap = bench_parser(__doc__)\nD = {"bf16": torch.bfloat16}\nif __name__ == "__main__": pass\n',
        "lib.py": "ap = argparse.ArgumentParser()\n",
    }) == ["own.py: its own argparse.ArgumentParser (use common.bench_parser)",
           "map.py: its own dtype map (use common.DTYPES / dtypes)"]
