"""CLI: argument parsing and errors, ``info``, and the default model (SmolLM2-135M-Instruct GGUF) answering
"What is the capital of France?" with "Paris" (greedy, chat) through ``python -m mistral_kernels``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import mistral_kernels
from mistral_kernels.cli import build_parser, main
from mistral_kernels.default_model import default_model_path


def _env() -> dict[str, str]:
    env = dict(os.environ)
    pkg_parent = str(Path(mistral_kernels.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = pkg_parent + os.pathsep + env.get("PYTHONPATH", "")
    env["MISTRAL_KERNELS_LIBRARY"] = str(mistral_kernels.library_path())
    return env


def test_parser_flags() -> None:
    args = build_parser().parse_args([
        "generate", "--model", "m.gguf", "--prompt", "a", "--prompt", "b", "--chat", "--system", "s",
        "--max-new-tokens", "7", "--temperature", "0.5", "--top-k", "3", "--top-p", "0.9", "--min-p", "0.1",
        "--seed", "4", "--dtype", "bf16", "--device", "cpu", "--max-batch", "2", "--block-size", "32",
        "--ignore-eos", "--stop", "###", "--num-blocks", "64", "--repetition-penalty", "1.1"])
    assert args.prompt == ["a", "b"] and args.chat and args.system == "s" and args.max_new_tokens == 7
    assert (args.temperature, args.top_k, args.top_p, args.min_p, args.seed) == (0.5, 3, 0.9, 0.1, 4)
    assert (args.dtype, args.max_batch, args.block_size, args.ignore_eos, args.stop) == ("bf16", 2, 32, True,
                                                                                          ["###"])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--max-new-tokens", "0"])


def test_generate_needs_a_prompt(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="at least one --prompt"):
        main(["generate"])
    with pytest.raises(SystemExit, match="does not exist"):
        main(["generate", "--prompts-file", str(tmp_path / "none.txt")])
    with pytest.raises(SystemExit, match="--system needs --chat"):
        main(["generate", "--prompt", "x", "--system", "y"])


def test_bad_model_path_is_a_clear_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["generate", "--model", str(tmp_path / "missing"), "--prompt", "x"]) == 2
    assert "cannot load the model" in capsys.readouterr().err


def test_info_default_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "n_layers: 30" in out and "parameters: total 134,515,008" in out
    assert "KV cache: 46,080 bytes per token" in out            # 2 · 30 layers · 3 heads · 64 · 4 bytes


def test_default_model_answers_paris(tmp_path: Path) -> None:
    default_model_path()  # fetched/cached outside the timed subprocess
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("What is the capital of France?\nName one primary color.\n")
    single = subprocess.run([sys.executable, "-m", "mistral_kernels", "generate", "--chat", "--prompt",
                             "What is the capital of France?", "--max-new-tokens", "12"],
                            capture_output=True, text=True, env=_env(), timeout=300)
    assert single.returncode == 0, single.stderr
    assert "Paris" in single.stdout, single.stdout
    stats = single.stderr.strip().splitlines()[-1]
    for field in ("load", "prompt", "decode", "tok/s", "GB/s", "peak mem"):
        assert field in stats, stats
    batch = subprocess.run([sys.executable, "-m", "mistral_kernels", "generate", "--chat", "--prompts-file",
                            str(prompts), "--max-new-tokens", "12"],
                           capture_output=True, text=True, env=_env(), timeout=300)
    assert batch.returncode == 0, batch.stderr
    assert batch.stdout.count("=== [") == 2 and "Paris" in batch.stdout.split("=== [1]")[0], batch.stdout
