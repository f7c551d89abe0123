"""Tensor / expert parallelism (mistral_kernels.parallel): 2 gloo ranks on CPU vs the single-process model.

Reference: the single-process :class:`~mistral_kernels.model.Model` (itself checked against transformers in
test_model_parity.py) on the same tiny random checkpoint saved by transformers' save_pretrained.
Tolerance: |Δlogit| ≤ 1e-4 in fp32 (only the all-reduce summation order differs); greedy tokens identical.
One spawn of 2 ranks runs every case (imports dominate the cost). Shape letters: T tokens, V vocab,
Hq / Hkv heads, D head_dim, I intermediate, E experts, H hidden.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from mistral_kernels.config import ModelConfig
from mistral_kernels.engine import Engine
from mistral_kernels import load_model
from mistral_kernels.parallel import (ParallelContext, ShardedModel, check_shardable, expert_range, head_range,
                                      kv_head_range, parameters_per_rank, shard_index)
from mistral_kernels.sampling import SamplingParams
from mistral_kernels.checkpoint import load_checkpoint

from .helpers.model_helpers import greedy_ours, save_consolidated
from .helpers.net_helpers import free_port, wait_healthy

transformers = pytest.importorskip("transformers")

VOCAB, SEQ, NEW, TP = 128, 24, 16, 2
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              head_dim=16, max_position_embeddings=256, initializer_range=0.2, rms_norm_eps=1e-5,
              attn_implementation="eager")
# case → (checkpoint, moe mode)
CASES = {"mistral_hkv2": ("mistral_hkv2/hf", "expert"), "mistral_hkv1": ("mistral_hkv1/hf", "expert"),
         "mixtral_ep": ("mixtral/hf", "expert"), "mixtral_ep_consolidated": ("mixtral/consolidated", "expert"),
         "mixtral_tp": ("mixtral/hf", "tensor")}


def _prompt() -> torch.Tensor:
    return torch.randint(0, VOCAB, (SEQ,), generator=torch.Generator().manual_seed(3))


def _engine_tokens(model: object, prompts: list[list[int]], seed: int | None) -> list[list[int]]:
    """Continuous batching over two prompts (greedy or seeded sampling), token ids only."""
    engine = Engine(model, None, num_blocks=16, block_size=8, max_batch=2, eos_ids=[])
    params = [SamplingParams(max_new_tokens=NEW, temperature=0.0 if seed is None else 1.0, seed=seed)
              for _ in prompts]
    rids = [engine.add_request(p, q) for p, q in zip(prompts, params)]
    return [c.token_ids for c in engine.run(rids)]


def _worker(rank: int, port: int, root: str, out: str) -> None:
    """One rank: every case's logits, paged greedy decode and engine generations, saved to ``out``."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(TP),
                      LOCAL_RANK=str(rank), GLOO_SOCKET_IFNAME="lo")
    dist.init_process_group("gloo", rank=rank, world_size=TP, timeout=datetime.timedelta(seconds=60))
    try:
        results = {}
        prompt = _prompt()
        for case, (ckpt, moe) in CASES.items():
            ctx, _ = ParallelContext.init_from_env(TP, "cpu", moe=moe)
            model = load_model(Path(root) / ckpt, progress=False, parallel=ctx)
            cache = model.new_cache(2, 8)
            results[case] = {
                "logits": model.logits(prompt),
                "greedy": greedy_ours(model, prompt, NEW),
                "engine_greedy": _engine_tokens(model, [prompt.tolist(), prompt[:9].tolist()], None),
                # per-rank random generators differ only if the broadcast were missing: seeded here, but
                # each rank draws from its own generator and rank 0's choice must win everywhere
                "engine_sampled": _engine_tokens(model, [prompt[:5].tolist()], seed=1000 + rank),
                "kv_heads": cache.k[0].shape[2],
                "qkv_rows": model.layers[0].qkv.shape[0],
                "wo_cols": model.layers[0].wo.shape[1],
                "w2_shape": tuple(model.layers[0].w2.shape),
            }
        torch.save(results, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny random Mistral (Hkv = 2 and 1) and Mixtral (E = 4, k = 2) checkpoints, saved by transformers."""
    base = tmp_path_factory.mktemp("tp")
    torch.manual_seed(0)
    for name, hf in (
        ("mistral_hkv2", transformers.MistralForCausalLM(
            transformers.MistralConfig(num_key_value_heads=2, sliding_window=16, **COMMON))),
        ("mistral_hkv1", transformers.MistralForCausalLM(
            transformers.MistralConfig(num_key_value_heads=1, sliding_window=None, **COMMON))),
        ("mixtral", transformers.MixtralForCausalLM(
            transformers.MixtralConfig(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                                       rope_theta=1e6, **COMMON))),
    ):
        hf.save_pretrained(base / name / "hf")
        if name == "mixtral":
            save_consolidated(base / name / "hf", base / name / "consolidated")  # per-expert tensors
    gguf = pytest.importorskip("gguf")
    from .helpers.gguf_helpers import _write_dense

    (base / "gguf").mkdir()
    _write_dense(base / "gguf" / "model.gguf", gguf.GGMLQuantizationType.Q8_0, tied=False)  # Hq 4, Hkv 2
    return base


@pytest.fixture(scope="module")
def ranks(root: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("tp_out")
    mp.spawn(_worker, args=(free_port(), str(root), str(out)), nprocs=TP, join=True)
    return [torch.load(out / f"rank{r}.pt") for r in range(TP)]


@pytest.mark.parametrize("case", list(CASES))
def test_two_ranks_match_one_process(case: str, root: Path, ranks: list[dict]) -> None:
    ckpt, _ = CASES[case]
    torch.set_num_threads(1)
    model = load_model(root / ckpt, progress=False)
    prompt = _prompt()
    want = model.logits(prompt)
    want_greedy = greedy_ours(model, prompt, NEW)
    want_engine = _engine_tokens(model, [prompt.tolist(), prompt[:9].tolist()], None)
    for r, res in enumerate(ranks):
        got = res[case]
        torch.testing.assert_close(got["logits"], want, atol=1e-4, rtol=0, msg=lambda m: f"rank {r}: {m}")
        assert got["greedy"] == want_greedy, f"rank {r}"
        assert got["engine_greedy"] == want_engine, f"rank {r}"
    assert ranks[0][case]["engine_sampled"] == ranks[1][case]["engine_sampled"]  # rank 0's tokens everywhere


def test_each_rank_holds_only_its_shard(ranks: list[dict]) -> None:
    """Local shapes: Hq/tp heads, Hkv/tp kv heads (1 replicated when Hkv = 1), I/tp, E/tp experts."""
    d, h = 16, 64
    for res in ranks:
        assert (res["mistral_hkv2"]["kv_heads"], res["mistral_hkv2"]["qkv_rows"]) == (1, (2 + 2 * 1) * d)
        assert (res["mistral_hkv1"]["kv_heads"], res["mistral_hkv1"]["qkv_rows"]) == (1, (2 + 2 * 1) * d)
        assert res["mistral_hkv2"]["wo_cols"] == 2 * d
        assert res["mistral_hkv2"]["w2_shape"] == (h, 96 // TP)
        assert res["mixtral_ep"]["w2_shape"] == (4 // TP, h, 96)        # E/tp whole experts
        assert res["mixtral_tp"]["w2_shape"] == (4, h, 96 // TP)        # all experts, I/tp columns


# ------------------------------------------------------------------ in-process: shard rules, loading, errors
def test_shard_rules_worked_examples() -> None:
    mistral = ModelConfig.mistral_7b_v01()
    assert head_range(mistral, 1, 4) == range(8, 16)
    assert kv_head_range(mistral, 1, 4) == range(2, 4)
    assert [kv_head_range(mistral.replace(n_kv_heads=2), r, 8) for r in (3, 4, 5)] == [range(0, 1), range(1, 2),
                                                                                      range(1, 2)]
    assert shard_index(mistral, "layers.0.wq", 1, 4) == (slice(1024, 2048),)
    assert shard_index(mistral, "layers.0.wk", 1, 4) == (slice(256, 512),)
    assert shard_index(mistral, "layers.0.wo", 1, 4) == (slice(None), slice(1024, 2048))
    assert shard_index(mistral, "layers.0.w1", 1, 4) == (slice(3584, 7168),)
    assert shard_index(mistral, "layers.0.w2", 1, 4) == (slice(None), slice(3584, 7168))
    assert shard_index(mistral, "embed", 1, 4) is None and shard_index(mistral, "layers.3.attn_norm", 1, 4) is None
    mixtral = ModelConfig.mixtral_8x7b()
    assert expert_range(mixtral, 2, 4) == range(4, 6)
    assert shard_index(mixtral, "layers.0.experts.w2", 1, 4) == (slice(2, 4),)
    assert shard_index(mixtral, "layers.0.experts.w1", 1, 4, "tensor") == (slice(None), slice(3584, 7168))
    assert shard_index(mixtral, "layers.0.gate", 1, 4) is None
    for config in (mistral, mixtral, ModelConfig.tiny_mixtral().replace(tie_embeddings=True)):
        assert parameters_per_rank(config, 1) == config.num_parameters()
    # Mixtral-8x7B (README): experts 45.10B and attention 1.34B split, 0.26B replicated
    assert [round(parameters_per_rank(mixtral, tp) / 1e9, 2) for tp in (2, 4, 8)] == [23.48, 11.87, 6.07]


@pytest.mark.parametrize("ckpt", ["mistral_hkv1/hf", "mixtral/hf", "mixtral/consolidated", "gguf/model.gguf"])
@pytest.mark.parametrize("moe", ["expert", "tensor"])
def test_sharded_load_reads_the_right_rows(root: Path, ckpt: str, moe: str) -> None:
    """Rank 1's fused shards equal the corresponding slices of the full fused weights (a sharded GGUF loads
    dequantized, so the full model it is compared with is loaded dequantized too)."""
    config, full = load_checkpoint(root / ckpt, progress=False, quantized=False)
    ctx = ParallelContext(rank=1, world_size=2, moe=moe)
    _, part = load_checkpoint(root / ckpt, progress=False, shard=ctx.shard)
    d, hq, hkv, i = config.head_dim, config.n_heads, config.n_kv_heads, config.hidden_dim
    q = slice(hq // 2 * d, hq * d)
    kv = slice(0, d) if hkv == 1 else slice(hkv // 2 * d, hkv * d)
    wq, wk, wv = full["layers.1.qkv"].split([hq * d, hkv * d, hkv * d])
    torch.testing.assert_close(part["layers.1.qkv"], torch.cat([wq[q], wk[kv], wv[kv]]), atol=0, rtol=0)
    torch.testing.assert_close(part["layers.1.wo"], full["layers.1.wo"][:, q], atol=0, rtol=0)
    for name in ("embed", "norm", "layers.1.attn_norm"):
        assert torch.equal(part[name], full[name])
    held = sum(t.numel() for t in part.values())  # memory per rank: the split parts halve
    assert held == parameters_per_rank(config, 2, moe) < sum(t.numel() for t in full.values())
    if config.is_moe:
        assert torch.equal(part["layers.1.gate"], full["layers.1.gate"])
        if moe == "expert":
            for w in ("w1", "w2", "w3"):
                assert torch.equal(part[f"layers.1.{w}"], full[f"layers.1.{w}"][2:4])
        else:
            for w in ("w1", "w3"):
                assert torch.equal(part[f"layers.1.{w}"], full[f"layers.1.{w}"][:, i // 2:])
            assert torch.equal(part["layers.1.w2"], full["layers.1.w2"][:, :, i // 2:])
    else:
        w1, w3 = full["layers.1.w13"].split([i, i])
        assert torch.equal(part["layers.1.w13"], torch.cat([w1[i // 2:], w3[i // 2:]]))
        assert torch.equal(part["layers.1.w2"], full["layers.1.w2"][:, i // 2:])


def test_indivisible_rank_counts_are_clear_errors(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tiny = ModelConfig.tiny_mistral()  # Hq = 4, Hkv = 2, I = 96
    with pytest.raises(ValueError, match=r"tensor parallel size 3 does not divide the 4 attention heads"):
        check_shardable(tiny, 3)
    with pytest.raises(ValueError, match=r"3 kv heads .* one must divide the other"):
        check_shardable(tiny.replace(n_heads=12, n_kv_heads=3), 2)
    with pytest.raises(ValueError, match=r"does not divide the intermediate size \(hidden_dim=90\)"):
        check_shardable(tiny.replace(hidden_dim=90), 4)
    six = ModelConfig.tiny_mixtral().replace(num_experts=6)  # heads split over 4 ranks, experts do not
    with pytest.raises(ValueError, match=r"expert parallel size 4 does not divide the 6 experts"):
        check_shardable(six, 4)
    check_shardable(six, 4, "tensor")  # I = 96 splits: tensor-parallel experts are the way out
    with pytest.raises(ValueError, match=r"moe parallel mode"):
        check_shardable(six, 2, "pipeline")
    with pytest.raises(ValueError, match=r"tensor parallel size 3 does not divide the 4 attention heads"):
        load_model(root / "mixtral/hf", progress=False, parallel=ParallelContext(rank=0, world_size=3))
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(ValueError, match=r"--tp 2 must equal the number of processes \(WORLD_SIZE=1\).*torchrun"):
        ParallelContext.init_from_env(2)


# ------------------------------------------------------------------ CLI under torchrun
def _word_tokenizer(path: Path) -> Path:
    """A word-level tokenizer.json over the tiny vocabulary: '<unk>' 0, '<s>' 1, '</s>' 2, 'w3' … 'w127'."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece()  # joins words with spaces
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    return path


def test_cli_torchrun_two_ranks(root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`torchrun --nproc-per-node 2 -m mistral_kernels generate --tp 2` prints once (rank 0) the same
    greedy text as one process."""
    import subprocess
    import sys

    import mistral_kernels
    from mistral_kernels.cli import main

    tok = _word_tokenizer(tmp_path / "tok")
    flags = ["--model", str(root / "mixtral/hf"), "--tokenizer", str(tok), "--prompt", "w5 w9 w7 w30 w11",
             "--max-new-tokens", str(NEW), "--ignore-eos"]
    assert main(["generate", *flags]) == 0
    want = capsys.readouterr().out
    assert len(want.split()) == NEW
    env = dict(os.environ, OMP_NUM_THREADS="1", MISTRAL_KERNELS_LIBRARY=str(mistral_kernels.library_path()),
               PYTHONPATH=str(Path(mistral_kernels.__file__).resolve().parent.parent) + os.pathsep
               + os.environ.get("PYTHONPATH", ""))
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(TP),
                "--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    run = subprocess.run([*torchrun, "-m", "mistral_kernels", "generate", "--tp", str(TP), *flags], env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout == want                                  # rank 1 printed nothing
    assert run.stderr.count("[stats]") == 1 and "tp 2" in run.stderr


def test_cli_tp_without_torchrun_is_a_clear_error(root: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from mistral_kernels.cli import main

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert main(["generate", "--tp", "2", "--model", str(root / "mixtral/hf"), "--prompt", "w5"]) == 2
    assert "--tp 2 must equal the number of processes (WORLD_SIZE=1)" in capsys.readouterr().err


def test_cli_info_per_rank(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from mistral_kernels.cli import main

    config, part = load_checkpoint(root / "mixtral/hf", progress=False,
                                   shard=ParallelContext(rank=0, world_size=2).shard)
    assert main(["info", "--model", str(root / "mixtral/hf"), "--tp", "2"]) == 0
    held = sum(t.numel() for t in part.values())
    kv = 2 * config.n_layers * 1 * config.head_dim * 4  # one of the 2 kv heads per rank, fp32
    out = capsys.readouterr().out
    assert f"tensor parallel 2, expert-parallel experts: per rank {held:,} parameters" in out
    assert f"KV cache {kv:,} bytes per token" in out.splitlines()[-1]
    assert main(["info", "--model", str(root / "mixtral/hf"), "--tp", "3"]) == 2
    assert "does not divide the 4 attention heads" in capsys.readouterr().err


def test_full_weights_with_a_parallel_context_are_rejected(root: Path) -> None:
    for ckpt in ("mistral_hkv2/hf", "mixtral/hf"):
        config, full = load_checkpoint(root / ckpt, progress=False)
        with pytest.raises(ValueError, match=r"layer 0, rank 1 of 2: weights are not this rank's shards: qkv"):
            ShardedModel(config, full, ParallelContext(rank=1, world_size=2))


def test_cli_torchrun_serve_two_ranks(root: Path, tmp_path: Path) -> None:
    """`torchrun --nproc-per-node 2 -m mistral_kernels serve --tp 2`: rank 0 answers a chat completion and a
    streamed one (after a client that left mid-stream) with the single-process greedy text; SIGTERM to
    torchrun stops every rank cleanly."""
    import signal
    import subprocess
    import sys

    pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install '.[serve]')")
    openai = pytest.importorskip("openai", reason="the test extra is not installed (pip install '.[test]')")

    import mistral_kernels
    from mistral_kernels import LLM

    tok = _word_tokenizer(tmp_path / "tok")
    (tok / "chat_template.jinja").write_text("{% for m in messages %}w4 {{ m['content'] }} {% endfor %}w6")
    chat = [{"role": "system", "content": "w8 w13"}, {"role": "user", "content": "w5 w9 w7 w30 w11"}]
    llm = LLM(root / "mixtral/hf", tokenizer=tok)
    want = llm.generate(["w5 w9 w7 w30 w11"], system="w8 w13", chat=True, max_new_tokens=NEW, ignore_eos=True)[0]
    assert len(want.token_ids) == NEW
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               MISTRAL_KERNELS_LIBRARY=str(mistral_kernels.library_path()),
               PYTHONPATH=str(Path(mistral_kernels.__file__).resolve().parent.parent) + os.pathsep
               + os.environ.get("PYTHONPATH", ""))
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(TP),
                "--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    proc = subprocess.Popen([*torchrun, "-m", "mistral_kernels", "serve", "--tp", str(TP), "--model",
                             str(root / "mixtral/hf"), "--tokenizer", str(tok), "--port", str(port),
                             "--served-model-name", "tiny"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url)
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        kw = dict(model="tiny", messages=chat, temperature=0, max_tokens=NEW, extra_body={"ignore_eos": True})
        with client.chat.completions.create(**{**kw, "max_tokens": 200}, stream=True) as left:
            next(iter(left))  # the client leaves after the first chunk: rank 0 aborts, rank 1 must follow
        r = client.chat.completions.create(**kw)
        assert r.choices[0].message.content == want.text
        assert r.usage.completion_tokens == NEW
        pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(**kw, stream=True)
                  if c.choices]
        assert "".join(pieces) == want.text
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=30)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    # torchrun itself exits 1 with its SignalException; the ranks print "stopped" right before returning 0,
    # and none had to be killed or raised
    assert "[rank 0]: stopped" in out and "[rank 1]: stopped" in out, out
    assert "forcefully" not in out, out
    assert all("SignalException" in t and "mistral_kernels" not in t
               for t in out.split("Traceback (most recent call last)")[1:]), out
