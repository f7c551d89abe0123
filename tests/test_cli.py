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

from .helpers.default_model_files import default_model_or_skip


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
    for argv, message in [(["generate"], "at least one --prompt"),
                          (["generate", "--prompts-file", str(tmp_path / "none.txt")], "does not exist"),
                          (["generate", "--prompt", "x", "--system", "y"], "--system needs --chat")]:
        assert main(argv) == 2
        assert message in capsys.readouterr().err


def test_bad_model_path_is_a_clear_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["generate", "--model", str(tmp_path / "missing"), "--prompt", "x"]) == 2
    assert "cannot load the model" in capsys.readouterr().err


def test_info_default_model(capsys: pytest.CaptureFixture[str]) -> None:
    default_model_or_skip()  # `info` without --model reads it
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "n_layers: 30" in out and "parameters: total 134,515,008" in out
    assert "KV cache: 46,080 bytes per token" in out            # 2 · 30 layers · 3 heads · 64 · 4 bytes
    # Q4_1: 20 bytes per 32 weights; the Q8_0 embedding dequantized to fp32, its packed tied head 34 / 32
    assert "stored formats: Q4_1 106,168,320 params 63.3 MiB (0.625 B/param), Q8_0 28,311,552 params" in out
    assert "weights as loaded: 0.195 GiB" in out and "Q8_0 (tied head) 0 params 28.7 MiB" in out
    assert main(["info", "--dequantize"]) == 0
    assert "weights as loaded: 0.501 GiB, 4.000 bytes per parameter: float32" in capsys.readouterr().out


# llama.cpp's greedy answer on the default model's file (llama-server, temperature 0, the same prompt token ids;
# benchmarks/results/cpu_quant_accuracy.md): its 8-bit activations tip the near-tied first token, as ours do.
LLAMA_CPP_ANSWER = "L'Étoile, la Marseillaise,"


def test_default_model_answers_paris(tmp_path: Path) -> None:
    """Exact activations answer Paris; the default (int8 activations inside the quantized matmuls) answers what
    llama.cpp answers on the same file."""
    default_model_or_skip()  # fetched/cached outside the timed subprocess
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("What is the capital of France?\nName one primary color.\n")
    single = subprocess.run([sys.executable, "-m", "mistral_kernels", "generate", "--chat", "--prompt",
                             "What is the capital of France?", "--max-new-tokens", "12", "--activations", "exact"],
                            capture_output=True, text=True, env=_env(), timeout=300)
    assert single.returncode == 0, single.stderr
    assert "Paris" in single.stdout, single.stdout
    stats = single.stderr.strip().splitlines()[-1]
    for field in ("load", "prompt", "decode", "tok/s", "GB/s", "prefix cache hit", "peak mem"):
        assert field in stats, stats
    batch = subprocess.run([sys.executable, "-m", "mistral_kernels", "generate", "--chat", "--prompts-file",
                            str(prompts), "--max-new-tokens", "12"],
                           capture_output=True, text=True, env=_env(), timeout=300)
    assert batch.returncode == 0, batch.stderr
    assert batch.stdout.count("=== [") == 2 and LLAMA_CPP_ANSWER in batch.stdout.split("=== [1]")[0], batch.stdout


# ------------------------------------------------------------------ user errors: one line, exit 2, no traceback
@pytest.fixture(scope="module")
def tiny_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Mistral with the default model's vocabulary (its tokenizer is passed with --tokenizer),
    and a copy whose config has zero attention heads."""
    transformers = pytest.importorskip("transformers")
    import json

    import torch

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("cli_tiny")
    cfg = transformers.MistralConfig(vocab_size=49152, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                     max_position_embeddings=256)
    transformers.MistralForCausalLM(cfg).save_pretrained(root / "tiny")
    bad = root / "zero_heads"
    bad.mkdir()
    for f in (root / "tiny").iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    config = json.loads((bad / "config.json").read_text())
    config["num_attention_heads"] = 0
    (bad / "config.json").write_text(json.dumps(config))
    return root


def _run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse
        rc = int(e.code or 0)
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("extra, message", [
    (["--prompts-file", "BAD_FILE"], "is not UTF-8 text (byte 0xff at offset 6)"),
    (["--prompts-file", "/dev/zero"], "is not a regular file"),
    (["--prompt", "\udcffhi"], "--prompt is not valid UTF-8 (byte 0xff"),  # how Python decodes a bad argv
    (["--prompt", "hi", "--num-blocks", str(10**12)], "num_blocks (--num-blocks) = 1000000000000 blocks"),
    (["--prompt", "hi", "--seed", str(2**70)], "argument --seed: seed must be in [-9223372036854775808, "),
    (["--prompt", "hi", "--temperature", "-1"], "--temperature: temperature must be in [0, 2]"),
    (["--prompt", "hi", "--temperature", "100"], "--temperature: temperature must be in [0, 2], got 100"),
    (["--prompt", "hi", "--model", "ZERO_HEADS"], "n_heads"),
])
def test_user_errors_are_one_line_exit_2(extra: list[str], message: str, tiny_checkpoints: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    bad_file = tmp_path / "prompts.txt"
    bad_file.write_bytes(b"hello \xff\xfe world\n")
    extra = [str(bad_file) if a == "BAD_FILE" else str(tiny_checkpoints / "zero_heads") if a == "ZERO_HEADS"
             else a for a in extra]
    argv = ["generate", "--model", str(tiny_checkpoints / "tiny"), "--tokenizer", str(default_model_or_skip()),
            "--max-new-tokens", "2", *extra]
    rc, err = _run_main(argv, capsys)
    assert rc == 2 and message in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_non_utf8_argv_in_a_subprocess_prints_no_traceback() -> None:
    """The real argv path (Python decodes the bytes with lone surrogates); the error comes before any load."""
    argv = [sys.executable.encode(), b"-m", b"mistral_kernels", b"generate", b"--prompt", b"\xff\xfehi"]
    r = subprocess.run(argv, capture_output=True, text=True, env=_env(), timeout=300)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == "mistral-kernels: --prompt is not valid UTF-8 (byte 0xff at character 0)", r.stderr
