"""Engine.step is free of host syncs apart from the one read of the sampled ids.

- The step's indices are validated once, on the host, by AttentionBatch.build (reference: the same errors the
  device checks raise, checked here on CPU), so the engine runs ``model.forward`` with the device index checks
  off: a spy on the model records the switch during every forward.
- On CPU no device exists, so a "read back" is any Python-level conversion of a tensor to host values
  (``item``, ``tolist``, ``bool``, ``int``, ``float``, ``numpy``): spies count them over whole steps — exactly one
  ``tolist`` (the sampled ids) per step that samples, prefill, decode and the padded decode runner alike.
- On a GPU (skipped here): ``torch.cuda.set_sync_debug_mode("error")`` around whole steps, with the one
  ``tolist`` let through.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import pytest
import torch

from mistral_kernels.batch import AttentionBatch
from mistral_kernels.config import ModelConfig
from mistral_kernels.engine import Engine
from mistral_kernels.ops import _base
from mistral_kernels.quant_weight import quantize_int8
from mistral_kernels.sampling import SamplingParams

from .helpers.model_helpers import random_model

CONFIG = ModelConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, hidden_dim=48, vocab_size=64,
                     max_position=128, sliding_window=12)
MOE = ModelConfig(dim=32, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8, hidden_dim=24, vocab_size=64,
                  max_position=128, num_experts=4, top_k=2)
READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy")


@contextlib.contextmanager
def count_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    counts = dict.fromkeys(READS, 0)
    for name in READS:
        original = getattr(torch.Tensor, name)

        def spy(self: torch.Tensor, *a: object, _name: str = name, _orig: object = original, **kw: object) -> object:
            counts[_name] += 1
            return _orig(self, *a, **kw)

        monkeypatch.setattr(torch.Tensor, name, spy)
    try:
        yield counts
    finally:
        monkeypatch.undo()


def _spy_checks(model: object) -> list[bool]:
    """Wrap model.forward: record whether the device index checks were on during each call."""
    seen: list[bool] = []
    forward = model.forward

    def spied(*a: object, **kw: object) -> torch.Tensor:
        seen.append(_base.device_index_checks_enabled())
        return forward(*a, **kw)

    model.forward = spied  # type: ignore[method-assign]
    return seen


@pytest.mark.parametrize("config,packed", [(CONFIG, False), (MOE, False), (MOE, True)],
                         ids=["dense-window", "moe", "moe-packed"])
@pytest.mark.parametrize("enforce_eager", [None, False], ids=["eager", "padded-runner"])
def test_step_reads_back_only_the_sampled_ids(config: ModelConfig, packed: bool, enforce_eager: bool | None,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    model = random_model(config, seed=1)
    if packed:  # int8 experts: the grouped quantized expert GEMMs (moe_qgemm) read no segment bounds back
        for layer in model.layers:
            layer.w1, layer.w2, layer.w3 = (quantize_int8(w) for w in (layer.w1, layer.w2, layer.w3))
    checks = _spy_checks(model)
    eng = Engine(model, None, num_blocks=32, block_size=4, max_batch=4, max_tokens_per_step=16, eos_ids=(),
                 enforce_eager=enforce_eager)
    params = [SamplingParams(max_new_tokens=6), SamplingParams(max_new_tokens=5, temperature=0.8, top_k=5, seed=3),
              SamplingParams(max_new_tokens=4, repetition_penalty=1.3, presence_penalty=0.5),
              SamplingParams(max_new_tokens=4, logit_bias={3: 2.0, 7: -100}, min_tokens=3, stop_token_ids=(5,))]
    rids = [eng.add_request(list(range(1 + 3 * i, 12 + 5 * i)), p) for i, p in enumerate(params)]
    steps = sampled_steps = 0
    while eng.has_unfinished():
        with count_reads(monkeypatch) as counts:
            outputs = eng.step()
        steps += 1
        sampled_steps += bool(outputs)
        assert counts == dict.fromkeys(READS, 0) | {"tolist": int(bool(outputs))}, steps
    assert sampled_steps >= 5 and checks and not any(checks)  # every forward ran with the checks off
    assert _base.device_index_checks_enabled()                 # and the switch is back on afterwards


def test_host_validation_replaces_the_device_checks() -> None:
    """The errors the device checks would raise are raised on the host lists, naming what is wrong."""
    ok = dict(block_size=4, num_blocks=8, max_position=16)
    AttentionBatch.build([[7, 0]], [4], [2], **ok)
    with pytest.raises(ValueError, match=r"block 8, outside \[0, 8\)"):
        AttentionBatch.build([[7, 8]], [4], [2], **ok)
    with pytest.raises(ValueError, match=r"block -1, outside"):
        AttentionBatch.build([[-1]], [0], [1], **ok)
    with pytest.raises(ValueError, match="position 16, beyond the model's max_position 16"):
        AttentionBatch.build([[1, 2, 3, 4, 5]], [15], [2], **ok)
    with pytest.raises(ValueError, match="needs 9 tokens but its block table holds 2 blocks"):
        AttentionBatch.build([[1, 2]], [8], [1], **ok)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (the CPU spies above prove the same)")
@pytest.mark.parametrize("enforce_eager", [True, None], ids=["eager", "cuda-graphs"])
def test_cuda_step_has_no_sync_but_the_sampled_ids(enforce_eager: bool | None,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import mistral_kernels

    if not mistral_kernels.cuda_compiled():
        pytest.skip("CUDA kernels not built")
    # head_dim 64: the CUDA attention kernels' smallest (test_attention.py)
    model = random_model(dataclasses.replace(CONFIG, head_dim=64), device="cuda", seed=1)
    eng = Engine(model, None, num_blocks=32, block_size=4, max_batch=4, max_tokens_per_step=16, eos_ids=(),
                 enforce_eager=enforce_eager)
    if enforce_eager is None:
        assert eng.runner.decode_graphs is not None and eng.runner.decode_graphs.captured == [1, 2, 4]
    rids = [eng.add_request(list(range(1, 10 + i)), SamplingParams(max_new_tokens=8, temperature=0.5 * i, seed=i,
                                                                  logit_bias={3: 1.5}, min_tokens=i,
                                                                  stop_token_ids=(5,)))
            for i in range(3)]
    eng.step()  # first prefill (lazy CUDA inits outside the check)
    torch.cuda.synchronize()
    tolist = torch.Tensor.tolist
    reads = []

    def allowed_read(self: torch.Tensor) -> list:
        reads.append(self.shape)
        torch.cuda.set_sync_debug_mode(0)
        try:
            return tolist(self)
        finally:
            torch.cuda.set_sync_debug_mode("error")

    monkeypatch.setattr(torch.Tensor, "tolist", allowed_read)
    torch.cuda.set_sync_debug_mode("error")
    try:
        while eng.has_unfinished():
            eng.step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert len(reads) >= 7
