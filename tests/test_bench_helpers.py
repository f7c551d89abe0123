"""The benchmarks' helper logic: the bytes of a decode step (benchmarks/roofline.py) against the config's
parameter count and the GGUF file's stored tensor sizes, the decode-step profiler's bookkeeping
(benchmarks/decode_profile.py; no timing asserted), and the parsing of llama.cpp's output
(benchmarks/llamacpp_output.py) on output captured from llama-bench / llama-completion."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import mistral_kernels.runner as runner_module
from mistral_kernels import load_model
from mistral_kernels.config import ModelConfig
from mistral_kernels.engine import Engine
from mistral_kernels.model import Model

from .helpers.model_helpers import random_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from decode_profile import profile_decode  # noqa: E402
from llamacpp_output import parse_bench_jsonl, parse_completion_timings  # noqa: E402
from roofline import step_bytes  # noqa: E402

gguf = pytest.importorskip("gguf")
from .helpers.quant_checkpoints import write_quant_gguf  # noqa: E402

LLAMA = ModelConfig(dim=256, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64, hidden_dim=256, vocab_size=320,
                    rope_is_neox=False, max_position=128)
MIXTRAL = ModelConfig(**{**vars(LLAMA), "num_experts": 4, "top_k": 2})


@pytest.mark.parametrize("config", [LLAMA, MIXTRAL], ids=["dense", "moe"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_dense_step_bytes_are_the_active_parameters(config: ModelConfig, dtype: torch.dtype) -> None:
    """Untied model: every active parameter but the input embedding, once; KV = context × bytes per token."""
    model = random_model(config, dtype=dtype)
    b = step_bytes(model, context=10.5)
    es = dtype.itemsize
    assert b.weights == (config.num_parameters(active_only=True) - config.vocab_size * config.dim) * es
    assert b.head == (config.vocab_size + 1) * config.dim * es  # LM head + final norm
    assert b.kv == round(10.5 * 2 * config.n_layers * config.n_kv_heads * config.head_dim * es)
    assert b.total == b.layers + b.head + b.kv


def test_packed_step_bytes_are_the_stored_blocks(tmp_path: Path) -> None:
    """Native Q4_1 layers + a tied Q8_0 embedding: the file's block bytes of every matrix (the embedding once,
    as the head), the norms in the activation dtype."""
    path = tmp_path / "q41.gguf"
    tied = ModelConfig(**{**vars(LLAMA), "tie_embeddings": True})
    write_quant_gguf(path, tied, lambda name, shape: "Q8_0" if "token_embd" in name else "Q4_1")
    stored = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(path).tensors}
    matrices = sum(n for name, n in stored.items() if name.startswith("blk.") and "norm" not in name)
    norms = 2 * tied.n_layers * tied.dim * 2  # bf16
    b = step_bytes(load_model(path, dtype=torch.bfloat16), context=0)
    assert b.layers == matrices + norms
    assert b.head == stored["token_embd.weight"] + tied.dim * 2
    assert b.kv == 0


# Captured from llama-bench / llama-completion built from llama-cpp-python 0.3.36's vendored llama.cpp.
BENCH_JSONL = (
    '{"build_commit": "0c1e570", "build_number": 1, "cpu_info": "AMD EPYC", "gpu_info": "", "backends": "'
    'CPU", "model_filename": "/root/.cache/mistral-kernels/SmolLM2-135M-Instruct.Q4_1.gguf", "model_type"'
    ': "llama 256M Q4_1", "model_size": 96576768, "model_n_params": 134515008, "n_batch": 2048, "n_ubatch'
    '": 512, "n_threads": 2, "cpu_mask": "0x0", "cpu_strict": false, "poll": 50, "type_k": "f16", "type_v'
    '": "f16", "n_gpu_layers": -1, "n_cpu_moe": 0, "split_mode": "layer", "main_gpu": 0, "no_kv_offload":'
    ' false, "flash_attn": -1, "devices": "auto", "tensor_split": "0.00", "tensor_buft_overrides": "none"'
    ', "load_mode": "auto", "lazy_mode": "auto", "embeddings": false, "no_op_offload": 0, "no_host": fals'
    'e, "repack": true, "fit_target": 0, "fit_min_ctx": 0, "n_prompt": 0, "n_gen": 8, "n_depth": 42, "tes'
    't_time": "2026-11-24T02:00:24Z", "avg_ns": 218889645, "stddev_ns": 0, "avg_ts": 36.548097, "stddev_t'
    's": 0.000000, "samples_ns": [ 218889645 ],"samples_ts": [ 36.5481 ]}\n'
)

COMPLETION_TAIL = """\
0.08.519.884 I generate: n_ctx = 256, n_batch = 2048, n_predict = 8, n_keep = 0
0.08.519.884 I 
0.28.606.197 I common_perf_print:    sampling time =       1.02 ms
0.28.606.216 I common_perf_print:    samplers time =       0.33 ms /    45 tokens
0.28.606.237 I common_perf_print:        load time =    8092.95 ms
0.28.606.252 I common_perf_print: prompt eval time =    6962.66 ms /    37 tokens (  188.18 ms per token,     5.31 tokens per second)
0.28.606.267 I common_perf_print:        eval time =   13078.92 ms /     7 runs   ( 1868.42 ms per token,     0.54 tokens per second)
0.28.606.280 I common_perf_print:       total time =   20086.84 ms /    44 tokens
0.28.606.294 I common_perf_print: unaccounted time =      44.24 ms /   0.2 %      (total - sampling - prompt eval - eval) / (total)
0.28.606.308 I common_perf_print:    graphs reused =          6
"""


def test_parse_llama_bench_jsonl() -> None:
    (r,) = parse_bench_jsonl("llama-bench: loading\n" + BENCH_JSONL)
    assert (r.n_prompt, r.n_gen, r.n_depth, r.n_threads) == (0, 8, 42, 2)
    assert r.avg_ts == pytest.approx(8 / 0.218889645, rel=1e-6)
    assert (r.build_commit, r.cpu_info, r.model_type) == ("0c1e570", "AMD EPYC", "llama 256M Q4_1")


def test_parse_llama_completion_timings() -> None:
    t = parse_completion_timings(COMPLETION_TAIL)
    assert (t.prompt_tokens, t.eval_runs) == (37, 7)
    assert t.prompt_tok_s == pytest.approx(5.31, abs=0.005)  # the tokens per second it printed
    assert t.eval_tok_s == pytest.approx(0.54, abs=0.005)


def test_parse_errors_show_the_output() -> None:
    with pytest.raises(ValueError, match="no jsonl result") as e:
        parse_bench_jsonl("main: error: failed to load model\n")
    assert "failed to load model" in str(e.value)
    with pytest.raises(ValueError, match="no timing lines"):
        parse_completion_timings("llama_model_load: error loading model\n")


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "per-op"])
def test_decode_profile_times_each_part_and_restores_the_engine(fused: bool) -> None:
    """Every part timed on every decode step, the layers path named, the bytes those of roofline.py, and the
    engine's own methods back in place afterwards."""
    model = random_model(LLAMA, dtype=torch.float32)
    if not fused:
        model.cpu_decode = None
    assert (model.cpu_decode is not None) == fused  # the dense fp32 model qualifies for the fused step
    engine = Engine(model, None, num_blocks=16, block_size=8, max_batch=1)
    prof = profile_decode(SimpleNamespace(engine=engine, model=model), [5, 6, 7], steps=4)
    assert prof.layers_kind == ("fused (ops.decode_layers)" if fused else "op by op")
    assert prof.steps == 4 and prof.context == 3 + 5 / 2
    assert all(sec >= 0 for sec in prof.seconds.values()) and prof.seconds["whole step"] > 0
    b = step_bytes(model, prof.context)
    assert prof.nbytes["decoder layers"] == b.layers + b.kv and prof.nbytes["whole step"] == b.total
    assert not {"step", "forward", "_layers"} & (vars(engine).keys() | vars(model).keys())
    assert engine.runner.execute.__func__ is type(engine.runner).execute
    assert runner_module.sample.__module__ == "mistral_kernels.sampling"
    assert model.forward.__func__ is Model.forward
    assert (model.cpu_decode is not None) == fused and type(model.cpu_decode).__name__ != "_Timed"
