"""Op-level fuzz: every raw op with wrong shapes on each dimension of each argument, other dtypes,
None, meta tensors, non-contiguous / stride-0 layouts, written arguments aliasing inputs, extreme scalars
(tests/helpers/op_fuzz_cases.py: the cases and the oracle). The cases run in subprocesses, many per process; a
crash or hang fails the test naming its case, and the run resumes after it so that every failure is listed.
Seeded; ~1,000 cases per namespace in a few seconds.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mistral_kernels

from .helpers.op_fuzz_cases import cases

ROOT = Path(__file__).resolve().parents[1]


def _run_all(namespace: str) -> tuple[dict[int, dict[str, str]], list[str]]:
    n = len(cases(namespace))
    results: dict[int, dict[str, str]] = {}
    crashes: list[str] = []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    start = 0
    while start < n:
        proc = subprocess.run([sys.executable, "-m", "tests.helpers.op_fuzz_cases", namespace, str(start), str(n)],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        last = start - 1
        for line in proc.stdout.splitlines():
            if line.startswith("START "):
                last = int(line.split()[1])
            elif line.startswith("RESULT "):
                _, i, payload = line.split(" ", 2)
                results[int(i)] = json.loads(payload)
        if proc.returncode == 0:
            break
        crashes.append(f"case {last} crashed the process (rc {proc.returncode}): {proc.stderr[-1500:]}")
        start = last + 1
    return results, crashes


@pytest.mark.parametrize("namespace", ["mistral_kernels", "mistral_kernels_emu"])
def test_op_fuzz(namespace: str) -> None:
    if namespace == "mistral_kernels_emu" and not mistral_kernels.emulator_compiled():
        pytest.skip("emulated kernels not built (MK_EMU=OFF); .ci/run requires them")
    results, crashes = _run_all(namespace)
    all_cases = cases(namespace)
    failures = [f"{r['op']} [{r['case']}]: {r['verdict']}" for r in results.values() if r["verdict"].startswith("FAIL")]
    crashed = [f"{all_cases[int(c.split()[1])][0].op} [{all_cases[int(c.split()[1])][1]}]: {c}" for c in crashes]
    assert not failures + crashed, "\n".join(failures + crashed)
    # every case ran, and the valid calls ran and matched the reference
    assert len(results) + len(crashes) == len(all_cases)
    valid = [r for r in results.values() if r["case"] == "valid"]
    assert valid and all(r["verdict"] == "ok: matches the reference" for r in valid), valid


def _placeholder(annotation: str, fill: str) -> object:
    if "Tensor" in annotation:
        return {"0-d": torch.zeros(()), "None": None, "int32": torch.zeros(3, dtype=torch.int32)}[fill]
    return {"float": 1.0, "int": 2, "bool": True}.get(annotation.split(" ")[0], None)


@pytest.mark.parametrize("fill", ["0-d", "None", "int32"])
def test_wrappers_reject_placeholder_tensors_clearly(fill: str) -> None:
    """The Python wrappers (mistral_kernels.ops) with every tensor argument 0-d, None or an int32 vector:
    a TypeError / ValueError / RuntimeError naming the op, never an IndexError or AttributeError of the wrapper."""
    from mistral_kernels import ops

    wrappers = [*ops.bind("mistral_kernels"), "linear"]
    for name in wrappers:
        fn = getattr(ops, name)
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.default is inspect.Parameter.empty and p.kind is p.POSITIONAL_OR_KEYWORD]
        args = [_placeholder(str(p.annotation), fill) for p in params]
        with pytest.raises((TypeError, ValueError, RuntimeError)) as info:
            fn(*args)
        assert name in str(info.value) or (name == "linear" and "skinny_linear" in str(info.value)), \
            f"{name}({fill}): {info.value}"


# ---- explicit regressions found by the fuzz (the fuzz above finds them too; these name them) -----------


def test_decode_rejects_q_rows_other_than_b(backend_one_schedule) -> None:
    ops = backend_one_schedule.ops
    kc = vc = torch.zeros(2, 4, 1, 64)
    tables, lens = torch.zeros(3, 1, dtype=torch.int32), torch.ones(3, dtype=torch.int32)
    for rows in (1, 4):  # fewer rows: reads past q and writes past out before the fix; more: garbage rows
        with pytest.raises(RuntimeError, match=r"paged_decode_attention: q.shape\[0\] must be 3"):
            ops.paged_decode_attention(torch.zeros(rows, 2, 64), kc, vc, tables, lens, 0.1)


def test_decode_partition_count_error_names_partition_size(backend_one_schedule) -> None:
    ops = backend_one_schedule.ops
    kc = vc = torch.zeros(1, 16, 1, 64)
    tables = torch.zeros(1, 4097, dtype=torch.int32)  # capacity 65,552 keys
    lens = torch.ones(1, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="partition_size=1 splits the 65552 keys .* pass partition_size >= 2"):
        ops.paged_decode_attention(torch.zeros(1, 1, 64), kc, vc, tables, lens, 0.1, partition_size=1)
    out = ops.paged_decode_attention(torch.ones(1, 1, 64), kc, vc, tables, lens, 0.1, partition_size=2)
    assert torch.equal(out, torch.zeros_like(out))  # one visible key with V = 0


def test_rope_rejects_k_aliasing_q_but_accepts_fused_qkv_views(backend_one_schedule) -> None:
    from mistral_kernels import reference as ref

    ops = backend_one_schedule.ops
    cache = ref.rope_cos_sin_cache(8, 8, 1e4)
    pos = torch.arange(3)
    q = torch.randn(3, 2, 8)
    with pytest.raises(RuntimeError, match="rotary_embedding: q .* shares memory with k"):
        ops.rotary_embedding(pos, q, q[:, :1], cache, True)
    with pytest.raises(RuntimeError, match="rotary_embedding: q .* shares memory with k"):
        ops.rotary_embedding(pos, q, q.view(6, 8)[1:4].view(3, 1, 8), cache, True)  # k straddles q's rows
    with pytest.raises(RuntimeError, match="rotary_embedding: q is written by this op but its elements overlap"):
        ops.rotary_embedding(pos, q[:1].expand(3, 2, 8), torch.randn(3, 1, 8), cache, True)
    qkv = torch.randn(3, 6 * 8)  # q: 4 heads, k: 1 head, v: 1 head of one fused buffer (Hq > 2·Hkv, as Mixtral)
    q_view, k_view = qkv[:, :32].view(3, 4, 8), qkv[:, 32:40].view(3, 1, 8)
    with pytest.raises(RuntimeError, match="rotary_embedding: q .* shares memory with k"):
        ops.rotary_embedding(pos, q_view, qkv[:, 24:32].view(3, 1, 8), cache, True)  # k = q's last head
    q_ref, k_ref = q_view.clone(), k_view.clone()
    ref.rotary_embedding(pos, q_ref, k_ref, cache, True)
    ops.rotary_embedding(pos, q_view, k_view, cache, True)
    torch.testing.assert_close(q_view, q_ref)
    torch.testing.assert_close(k_view, k_ref)


def test_rms_norm_out_may_be_x(backend_one_schedule) -> None:
    from mistral_kernels import reference as ref

    ops = backend_one_schedule.ops
    x, w = torch.randn(3, 16), torch.randn(16)
    expected = ref.rms_norm(x, w)
    assert ops.rms_norm(x, w, out=x) is x
    torch.testing.assert_close(x, expected)
    with pytest.raises(RuntimeError, match="silu_and_mul: out is written by this op but shares memory with x"):
        buf = torch.randn(48)  # out (contiguous) overlaps the middle of x: a partial overlap the fuzz found
        ops.silu_and_mul(buf.view(3, 16), out=buf[8:32].view(3, 8))


# ---- decode_layers (the fuzz cases above include its own; these name what they found) ------------------


def _decode_layers_call() -> dict:
    from .helpers.op_fuzz_cases import valid_calls

    return next(c for c in valid_calls("mistral_kernels") if c.op == "decode_layers").args


def test_decode_layers_refuses_weights_in_written_memory() -> None:
    """A norm or matrix inside x / residual / a cache would be overwritten while the layers run."""
    a = _decode_layers_call()
    for name, view in (("attn_norm", a["x"].view(-1)[:32]), ("ffn_norm", a["residual"].view(-1)[32:])):
        args = {**a, name: [view, a[name][1]]}
        with pytest.raises(RuntimeError, match=rf"decode_layers: (x|residual) is written by this op but shares "
                                               rf"memory with {name}\[0\]"):
            torch.ops.mistral_kernels.decode_layers(*args.values())
    args = {**a, "v_cache": [a["k_cache"][0], a["v_cache"][1]]}
    with pytest.raises(RuntimeError, match=r"decode_layers: .*_cache\[0\] is written by this op but shares memory "
                                           r"with .*_cache\[0\]"):
        torch.ops.mistral_kernels.decode_layers(*args.values())


def test_decode_layers_refuses_two_rows_writing_one_slot() -> None:
    """Each row writes a slot of its own (a row reading a block another row writes is allowed: the step then
    writes every row first, tests/test_cpu_decode.py::test_rows_of_one_sequence_write_before_attending)."""
    a = _decode_layers_call()
    with pytest.raises(RuntimeError, match=r"slot_mapping\[0\] and slot_mapping\[1\] are both 1;"):
        # block 0: in no row's visible blocks, written by both
        torch.ops.mistral_kernels.decode_layers(*{**a, "slot_mapping": torch.tensor([1, 1])}.values())
