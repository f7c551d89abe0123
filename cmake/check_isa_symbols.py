"""Build-time ODR guard of the per-ISA CPU kernels (csrc/cpu/isa/target.h; run by CMakeLists.txt before _C links).

Every csrc/cpu/isa/*.cpp is compiled once per ISA level into the object library mk_cpu_<level>. A weak
symbol (an inline function or template instance not inlined everywhere) that one level's object defines
outside that level's namespaces could be the copy the linker keeps for every caller, so code compiled with
-mavx512f would run on the baseline path: SIGILL on an older CPU. This script fails the build when any
weak or unique symbol (nm types W, V, u) of a level's object lies outside mk::cpu::isa_<level> and
mk::abi_cpu_<level> (the namespaces appear length-prefixed in the mangled name).

    python cmake/check_isa_symbols.py --nm nm OBJECT...
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

WEAK_TYPES = {"W", "V", "u"}
# Compiler-generated data, the same in every object whatever the flags (the C++ exception personality ref).
HARMLESS_PREFIXES = ("DW.ref.",)
LEVEL_DIR = re.compile(r"mk_cpu_([a-z0-9]+)\.dir")


def offending(nm: str, obj: str, level: str) -> list[str]:
    allowed = [f"{len(ns)}{ns}" for ns in (f"isa_{level}", f"abi_cpu_{level}")]
    out = subprocess.run([nm, "--defined-only", obj], check=True, capture_output=True, text=True).stdout
    bad = []
    for line in out.splitlines():
        parts = line.split()
        if (len(parts) == 3 and parts[1] in WEAK_TYPES and not parts[2].startswith(HARMLESS_PREFIXES)
                and not any(a in parts[2] for a in allowed)):
            bad.append(parts[2])
    return bad


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nm", default="nm")
    ap.add_argument("objects", nargs="+")
    args = ap.parse_args()
    failures = []
    for obj in args.objects:
        m = LEVEL_DIR.search(obj)
        if m is None:
            print(f"check_isa_symbols: cannot tell the ISA level of {obj} (expected .../mk_cpu_<level>.dir/...)",
                  file=sys.stderr)
            return 2
        failures += [f"{obj}: {sym}" for sym in offending(args.nm, obj, m.group(1))]
    if failures:
        print("check_isa_symbols: weak symbols outside their ISA level's namespaces (csrc/cpu/isa/target.h):\n  "
              + "\n  ".join(failures), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
