"""The op list has one source: the schemas csrc/registration.cpp registers. Everything else must follow it —
a public wrapper in ``ops`` (and ``emulated``), a fake (meta) implementation, a reference in ``reference``,
an opcheck case in tests/test_opcheck.py — and nothing may exist without a schema.

``problems()`` compares explicit sets; test_problems_are_reported feeds it inventories with one piece
removed or one extra piece added, to show each rule fails when broken.
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

import mistral_kernels
from mistral_kernels import ops, reference

from .helpers.opcheck import CASES

NATIVE, EMU = ops.NAMESPACES
# CPU-only helper schemas (registered in mistral_kernels only) → the public function that serves them.
HELPER_WRAPPERS = {"decode_layers": "decode_layers", "skinny_linear": "linear"}
# Public functions that are not a kernel: plain torch / configuration.
NON_KERNEL = {"rope_cos_sin_cache", "device_index_checks"}


@dataclasses.dataclass
class Inventory:
    schemas: dict[str, set[str]]  # namespace → registered op names
    faked: dict[str, set[str]]  # namespace → op names with a fake (Meta) implementation
    ops_public: set[str]  # ops.__all__
    emulated_public: set[str]  # emulated.__all__
    family_wrappers: set[str]  # the public methods of the ops family classes
    references: set[str]  # reference.__all__
    cases: set[str]  # op names of tests/test_opcheck.py CASES


def problems(inv: Inventory) -> list[str]:
    found: list[str] = []
    native, emu = inv.schemas[NATIVE], inv.schemas[EMU]
    cpu_only = native - emu
    if cpu_only != set(HELPER_WRAPPERS):
        found.append(f"CPU-only schemas {sorted(cpu_only)} differ from the helpers with a declared public "
                     f"wrapper {sorted(HELPER_WRAPPERS)}")
    for ns, public, where in ((NATIVE, inv.ops_public, "ops"), (EMU, inv.emulated_public, "emulated")):
        for name in sorted(inv.schemas[ns]):
            wrapper = HELPER_WRAPPERS.get(name, name)
            if wrapper not in public:
                found.append(f"{ns}::{name} has no public wrapper {where}.{wrapper}")
            if name not in inv.faked[ns]:
                found.append(f"{ns}::{name} has no fake implementation")
            if wrapper not in inv.references:
                found.append(f"{ns}::{name} has no reference function reference.{wrapper}")
            if name not in inv.cases:
                found.append(f"{ns}::{name} has no opcheck case in tests/test_opcheck.py")
    for name in sorted(inv.family_wrappers - emu):
        found.append(f"wrapper method {name} has no schema in {EMU}")
    for name in sorted(inv.family_wrappers - native):
        found.append(f"wrapper method {name} has no schema in {NATIVE}")
    helpers = set(HELPER_WRAPPERS.values())
    for name in sorted(inv.ops_public - native - helpers - NON_KERNEL):
        found.append(f"ops.{name} is exported but no schema {NATIVE}::{name} exists")
    for name in sorted(inv.emulated_public - emu - NON_KERNEL):
        found.append(f"emulated.{name} is exported but no schema {EMU}::{name} exists")
    for name in sorted(inv.references - native - helpers - NON_KERNEL):
        found.append(f"reference.{name} exists but no schema {name} does")
    for name in sorted(inv.cases - native - emu):
        found.append(f"opcheck case {name} names no registered schema")
    return found


def _has_fake(ns: str, name: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"{ns}::{name}", "Meta")


def _emulated_public() -> set[str]:
    if not mistral_kernels.emulator_compiled():
        pytest.skip("emulated kernels not built (MK_EMU=OFF); .ci/run requires them")
    from mistral_kernels import emulated

    return set(emulated.__all__)


def _inventory() -> Inventory:
    schemas = {ns: set(ops.op_names(ns)) for ns in ops.NAMESPACES}
    return Inventory(
        schemas=schemas,
        faked={ns: {n for n in names if _has_fake(ns, n)} for ns, names in schemas.items()},
        ops_public=set(ops.__all__),
        emulated_public=_emulated_public(),
        family_wrappers={n for family in ops.FAMILIES for n in family.wrapper_names()},
        references=set(reference.__all__),
        cases={name for name, _ in CASES},
    )


def test_every_schema_has_its_pieces_and_nothing_lacks_a_schema() -> None:
    inv = _inventory()
    assert "rms_norm" in inv.schemas[NATIVE] and "paged_decode_attention" in inv.schemas[EMU]
    assert problems(inv) == []


def test_problems_are_reported() -> None:
    good = _inventory()

    def broken(**changes: object) -> list[str]:
        return problems(dataclasses.replace(good, **changes))

    assert broken(cases=good.cases - {"moe_expert_ffn"}) == [
        f"{NATIVE}::moe_expert_ffn has no opcheck case in tests/test_opcheck.py",
        f"{EMU}::moe_expert_ffn has no opcheck case in tests/test_opcheck.py",
    ]
    assert broken(cases=good.cases - {"skinny_linear"}) == [
        f"{NATIVE}::skinny_linear has no opcheck case in tests/test_opcheck.py"
    ]
    assert broken(faked={**good.faked, EMU: good.faked[EMU] - {"fused_moe"}}) == [
        f"{EMU}::fused_moe has no fake implementation"
    ]
    assert broken(references=good.references - {"linear"}) == [
        f"{NATIVE}::skinny_linear has no reference function reference.linear"
    ]
    assert broken(emulated_public=good.emulated_public - {"rms_norm"}) == [
        f"{EMU}::rms_norm has no public wrapper emulated.rms_norm"
    ]
    assert broken(family_wrappers=good.family_wrappers | {"ghost_op"}) == [
        f"wrapper method ghost_op has no schema in {EMU}",
        f"wrapper method ghost_op has no schema in {NATIVE}",
    ]
    assert broken(ops_public=good.ops_public | {"ghost_op"}) == [
        f"ops.ghost_op is exported but no schema {NATIVE}::ghost_op exists"
    ]
    assert broken(cases=good.cases | {"ghost_op"}) == ["opcheck case ghost_op names no registered schema"]
    # A new schema registered in one namespace only, with nothing else.
    schemas = {**good.schemas, NATIVE: good.schemas[NATIVE] | {"new_op"}}
    faked = {**good.faked, NATIVE: good.faked[NATIVE] | {"new_op"}}
    assert broken(schemas=schemas, faked=faked) == [
        f"CPU-only schemas ['decode_layers', 'new_op', 'skinny_linear'] differ from the helpers with a declared "
        "public wrapper ['decode_layers', 'skinny_linear']",
        f"{NATIVE}::new_op has no public wrapper ops.new_op",
        f"{NATIVE}::new_op has no reference function reference.new_op",
        f"{NATIVE}::new_op has no opcheck case in tests/test_opcheck.py",
    ]


def test_wrappers_are_bound_to_their_namespace() -> None:
    for name in ops.KERNEL_OPS:
        assert getattr(ops, name).__self__._lib is torch.ops.mistral_kernels, name
    _emulated_public()
    from mistral_kernels import emulated

    kernel_ops = set(emulated.__all__) - NON_KERNEL
    assert kernel_ops == set(ops.KERNEL_OPS)
    for name in kernel_ops:
        assert getattr(emulated, name).__self__._lib is torch.ops.mistral_kernels_emu, name


def test_emulated_twin_has_the_same_signatures_and_docs() -> None:
    _emulated_public()
    from mistral_kernels import emulated

    for name in emulated.__all__:
        ours, twin = getattr(ops, name), getattr(emulated, name)
        assert inspect.signature(twin) == inspect.signature(ours), name
        assert twin.__doc__ == ours.__doc__ and ours.__doc__, name


def test_public_import_paths() -> None:
    _emulated_public()
    import mistral_kernels.emulated as top_emulated
    import mistral_kernels.reference as top_reference
    from mistral_kernels.ops import emulated as pkg_emulated, reference as pkg_reference

    assert mistral_kernels.ops is ops and mistral_kernels.reference is top_reference
    assert top_reference.__all__ == pkg_reference.__all__
    assert all(getattr(top_reference, n) is getattr(pkg_reference, n) for n in pkg_reference.__all__)
    assert top_emulated.__all__ == pkg_emulated.__all__
    assert all(getattr(top_emulated, n) is getattr(pkg_emulated, n) for n in pkg_emulated.__all__)
