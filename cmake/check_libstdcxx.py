"""Post-link guard: _C.so must not carry its own copy of libstdc++'s iostream code (cmake/libstdcxx.cmake).

A copy next to the libstdc++.so.6 that torch loads formats numbers through facets the running locale never
registered: every error message that prints a number segfaults or loses the number. This script fails the
build when the library defines one of libstdc++'s explicitly instantiated members (they live in
libstdc++.so.6 and are never instantiated by user code).

    python cmake/check_libstdcxx.py --nm nm _C.so
"""

from __future__ import annotations

import argparse
import subprocess
import sys

# std::ostream::_M_insert<long>, std::num_put<char>::id, std::basic_ios<char>::init: defined only by libstdc++.
MARKERS = ("_ZNSo9_M_insertIlEERSoT_", "_ZNSt7num_putIcSt19ostreambuf_iteratorIcSt11char_traitsIcEEE2idE",
           "_ZNSt9basic_iosIcSt11char_traitsIcEE4initEPSt15basic_streambufIcS1_E")


def copied_members(nm: str, library: str) -> list[str]:
    out = subprocess.run([nm, "--defined-only", "-D", library], check=True, capture_output=True, text=True).stdout
    names = {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}
    return [m for m in MARKERS if m in names]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nm", default="nm")
    ap.add_argument("library")
    a = ap.parse_args()
    found = copied_members(a.nm, a.library)
    if found:
        print(f"{a.library} defines libstdc++'s own members {found}: the compiler linked libstdc++ statically. "
              "Reconfigure (cmake/libstdcxx.cmake links the shared libstdc++.so.6) or use a compiler whose "
              "library directory has libstdc++.so.", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
