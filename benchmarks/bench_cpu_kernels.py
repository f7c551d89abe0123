"""Bandwidth of the per-ISA CPU decode kernels (csrc/cpu/isa: dense ``gemv_rows``, packed ``quant_gemv``), per
level and shape, against the read and copy bandwidth measured in the same run; before / after interleaved.

    python benchmarks/bench_cpu_kernels.py [--baseline main] [--threads 1,2] [--levels avx512bf16,avx2]
                                           [--kernels dense,quant] [--only-shape smollm2] [--out FILE]

The kernels are built with a small driver (benchmarks/native/kernel_bench.cpp) into standalone shared
libraries, no torch: one from this tree's csrc/ and one from ``--baseline`` (a git ref, extracted with
``git archive``; ``--baseline ''`` skips it), loaded side by side with ctypes and called alternately, so both
builds see the same machine load. A pass walks a pool of identical weight matrices (at least ``--pool-mb``,
3× the L3 by default) so every weight byte comes from memory, as in a decode step; with T threads each thread
computes its column slice of a matrix (csrc/cpu/decode_step.h's split) between two barriers. GB/s = weight
bytes of one matrix (packed bytes for the block formats) / the fastest call (on a shared machine the least
disturbed one); the bound is the read bandwidth of the same threads measured alike (a plain sum, fastest
2 MB item of a 256 MB buffer), the copy bandwidth (reads + writes) is shown too. x is prepared once outside the timing (bf16 x: int8 quantization or chunk sums, as the glue does).
Shapes: SmolLM2-135M (H 576, I 1536, qkv N 960, head N 49152), a Mistral-shaped ~1B (H 2048, I 5632,
Hq 16 / Hkv 4, D 128) and Mistral-7B (H 4096, I 14336, Hq 32 / Hkv 8, vocabulary 32768); K-quants need K % 256 == 0 (SmolLM2's K = 576 matrices are skipped for them).
Results: benchmarks/results/cpu_kernels.md.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "kernel_bench"
DRIVER = ROOT / "benchmarks" / "native" / "kernel_bench.cpp"
LEVELS = ["avx512bf16", "avx512", "avx2", "generic"]
LEVEL_FLAGS = {  # CMakeLists.txt MK_CPU_ISA_FLAGS_<level>
    "avx512bf16": "-mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mavx512vnni",
    "avx512": "-mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq",
    "avx2": "-mavx2 -mfma -mf16c",
    "generic": "",
}
ISA_SOURCES = ["gemv.cpp", "quant.cpp"]
CXX = ["g++", "-std=c++20", "-O3", "-DNDEBUG", "-fPIC", "-fvisibility=hidden", "-w"]

# (model, weight) → (N, K)
SHAPES = {
    ("smollm2", "qkv"): (960, 576),
    ("smollm2", "o"): (576, 576),
    ("smollm2", "gate+up"): (3072, 576),
    ("smollm2", "down"): (576, 1536),
    ("smollm2", "head"): (49152, 576),
    ("mistral-1b", "qkv"): (3072, 2048),
    ("mistral-1b", "o"): (2048, 2048),
    ("mistral-1b", "gate+up"): (11264, 2048),
    ("mistral-1b", "down"): (2048, 5632),
    ("mistral-7b", "qkv"): (6144, 4096),
    ("mistral-7b", "o"): (4096, 4096),
    ("mistral-7b", "gate+up"): (28672, 4096),
    ("mistral-7b", "down"): (4096, 14336),
    ("mistral-7b", "head"): (32768, 4096),
}
QFORMATS = {"Q4_0": (2, 32), "Q4_1": (3, 32), "Q8_0": (8, 32), "Q4_K": (12, 256), "Q5_K": (13, 256), "Q6_K": (14, 256)}
PATHS = {0: "int8", 1: "bf16", 2: "fp32", 3: "int8k"}


def build(csrc: Path, out: Path, extra: str = "") -> Path:
    """The driver + csrc/cpu/isa/{gemv,quant}.cpp for every level as one shared library (objects cached by
    content; `extra`: more compiler flags for gemv.cpp, e.g. -D overrides of its tuning constants)."""
    files = sorted((csrc / "cpu" / "isa").glob("*")) + sorted((csrc / "kernels").glob("quant_blocks.h"))
    files += [csrc / "kernels" / "common.cuh", csrc / "abi.h"]
    blob = b"".join(f.read_bytes() for f in files if f.is_file())
    kdigest = hashlib.sha256(blob).hexdigest()[:16]
    edigest = hashlib.sha256(extra.encode()).hexdigest()[:8]
    ddigest = hashlib.sha256(DRIVER.read_bytes() + b"".join(f.read_bytes() for f in files[:-2])).hexdigest()[:16]
    lib = out / f"kernel_bench_{kdigest}_{edigest}_{ddigest}.so"
    if lib.exists():
        return lib
    obj_dir = out / f"obj_{kdigest}"
    obj_dir.mkdir(parents=True, exist_ok=True)
    # `extra` applies to gemv.cpp only (its tuning constants): the quant objects are shared by the variants
    objs = [obj_dir / f"{lv}_{src}{'.' + edigest if src == 'gemv.cpp' and extra else ''}.o"
            for lv in LEVELS for src in ISA_SOURCES]
    jobs = []
    for obj, (level, src) in zip(objs, [(lv, src) for lv in LEVELS for src in ISA_SOURCES]):
        if not obj.exists():
            flags = extra.split() if src == "gemv.cpp" else []
            jobs.append([*CXX, *flags, *LEVEL_FLAGS[level].split(), f"-DMK_ISA_NS=isa_{level}",
                         f"-DMK_ABI=abi_cpu_{level}", f"-I{csrc}", "-c", str(csrc / "cpu" / "isa" / src), "-o", str(obj)])
    drv = out / f"driver_{ddigest}.o"
    if not drv.exists():
        jobs.append([*CXX, "-DMK_ABI=abi_bench", f"-I{csrc}", "-c", str(DRIVER), "-o", str(drv)])
    with ThreadPoolExecutor(2) as ex:
        for r in ex.map(lambda c: subprocess.run(["nice", *c], capture_output=True, text=True), jobs):
            if r.returncode:
                sys.exit(f"build failed: {' '.join(r.args)}\n{r.stderr}")
    subprocess.run([*CXX, "-shared", "-pthread", "-o", str(lib), str(drv), *map(str, objs)], check=True)
    return lib


def baseline_csrc(ref: str, dest: Path) -> Path:
    """csrc/ of git ref `ref`, extracted into dest."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "csrc"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest / "csrc"


def load(lib: Path) -> ctypes.CDLL:
    dll = ctypes.CDLL(str(lib), mode=os.RTLD_LOCAL)
    i, i64, d = ctypes.c_int, ctypes.c_int64, ctypes.c_double
    dll.mkb_read_gbs.argtypes, dll.mkb_read_gbs.restype = [i, i64, i64, i], d
    dll.mkb_copy_gbs.argtypes, dll.mkb_copy_gbs.restype = [i, i64, i64, i], d
    dll.mkb_gemv.argtypes, dll.mkb_gemv.restype = [i, i, i, i64, i64, i, i, i], d
    dll.mkb_qbytes.argtypes, dll.mkb_qbytes.restype = [i, i64, i64], i64
    dll.mkb_quant.argtypes = [i, i, i, i, i64, i64, i, i, i, ctypes.POINTER(ctypes.c_int)]
    dll.mkb_quant.restype = d
    return dll


def supported_levels() -> list[str]:
    flags = Path("/proc/cpuinfo").read_text().split("flags")[1].split("\n")[0].split() if Path("/proc/cpuinfo").exists() else []
    need = {"avx512bf16": {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "avx512_vnni"},
            "avx512": {"avx512f", "avx512bw", "avx512vl", "avx512dq"}, "avx2": {"avx2", "fma", "f16c"}, "generic": set()}
    return [lv for lv in LEVELS if need[lv] <= set(flags)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", default="main", help="git ref of the 'before' kernels ('' : none)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--levels", default="avx512bf16,avx512,avx2")
    ap.add_argument("--kernels", default="dense,quant")
    ap.add_argument("--formats", default="Q4_1,Q4_K,Q6_K,Q8_0")
    ap.add_argument("--ms", default="1,8")
    ap.add_argument("--xdtypes", default="bf16,fp32", help="activation dtypes of the quantized rows")
    ap.add_argument("--only-shape", default="", help="substring of 'model weight'")
    ap.add_argument("--pool-mb", type=int, default=64)
    ap.add_argument("--reps", type=int, default=4, help="passes over the pool per measurement, x2 interleaved")
    ap.add_argument("--variants", default="", help="more builds of this tree: 'name=-DFLAG=1 ...;name2=...'")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    BUILD.mkdir(parents=True, exist_ok=True)
    builds = {"new": load(build(ROOT / "csrc", BUILD))}
    for spec in filter(None, args.variants.split(";")):
        name, flags = spec.split("=", 1)
        builds[name] = load(build(ROOT / "csrc", BUILD, flags))
    if args.baseline:
        with tempfile.TemporaryDirectory() as tmp:
            builds = {"old": load(build(baseline_csrc(args.baseline, Path(tmp)), BUILD)), **builds}
    levels = [lv for lv in args.levels.split(",") if lv in supported_levels()]
    shapes = {k: v for k, v in SHAPES.items() if args.only_shape in f"{k[0]} {k[1]}"}
    ms = [int(m) for m in args.ms.split(",")]
    lines = [f"`python benchmarks/bench_cpu_kernels.py {' '.join(sys.argv[1:])}`; builds: "
             + ", ".join(builds) + (f" (old = `{args.baseline}`)" if args.baseline else "")
             + f"; pool ≥ {args.pool_mb} MB per measurement; cells: GB/s of weight bytes"
             + (f" ({' / '.join(b for b in builds if b != 'new')} → new)" if len(builds) > 1 else "")
             + ", % of the read bandwidth (new); quantized: the path of bf16 x (int8 / bf16 / fp32).\n"]

    def best_of(fn) -> dict[str, float]:  # seconds per build, builds interleaved twice
        t = {name: float("inf") for name in builds}
        for _ in range(2):
            for name, dll in builds.items():
                t[name] = min(t[name], fn(dll))
        return t

    for threads in (int(t) for t in args.threads.split(",")):
        dll = builds["new"]
        read = max(dll.mkb_read_gbs(threads, 256 << 20, 2 << 20, args.reps) for _ in range(2))
        copy = max(dll.mkb_copy_gbs(threads, 256 << 20, 2 << 20, args.reps) for _ in range(2))
        head = (f"## {threads} thread{'s' if threads > 1 else ''}: read {read:.1f} GB/s, copy {copy:.1f} GB/s (reads + "
                "writes; fastest 2 MB item)")
        print(head, flush=True)
        lines.append(head + "\n")
        cols = [f"{m} {w} {n}×{k}" for (m, w), (n, k) in shapes.items()]
        lines.append("| level | kernel | M | " + " | ".join(cols) + " |")
        lines.append("|---" * (3 + len(cols)) + "|")
        rows: list[tuple[str, str, int, object]] = []
        for level in levels:
            li = LEVELS.index(level)
            if "dense" in args.kernels:
                for dt, elem, es in (("bf16", 1, 2), ("fp32", 0, 4)):
                    rows += [(level, f"dense {dt}", m, ("dense", elem, es)) for m in ms]
            if "quant" in args.kernels:
                for f in args.formats.split(","):
                    for xdt in args.xdtypes.split(","):
                        rows += [(level, f"{f} x {xdt}", m, ("quant", f, xdt == "bf16")) for m in ms]
            for level_, name, m, spec in [r for r in rows if r[0] == level]:
                cells = []
                for (model, w), (n, k) in shapes.items():
                    if spec[0] == "dense":
                        nbytes = n * k * spec[2]
                        nmat = max(2, -(-(args.pool_mb << 20) // nbytes))
                        fn = lambda d, n=n, k=k, nmat=nmat: d.mkb_gemv(li, spec[1], m, n, k, threads, nmat, args.reps)
                    else:
                        qt, qk = QFORMATS[spec[1]]
                        if k % qk:
                            cells.append("—")
                            continue
                        nbytes = builds["new"].mkb_qbytes(qt, n, k)
                        nmat = max(2, -(-(args.pool_mb << 20) // nbytes))
                        path = ctypes.c_int(-1)
                        fn = lambda d, n=n, k=k, nmat=nmat, qt=qt: d.mkb_quant(li, qt, int(spec[2]), m, n, k, threads,
                                                                              nmat, args.reps, ctypes.byref(path))
                    t = best_of(fn)
                    label = f" {PATHS.get(path.value, '?')}" if spec[0] == "quant" and spec[2] else ""
                    gbs = {b: nbytes / s / 1e9 for b, s in t.items()}
                    new = gbs["new"]
                    others = " / ".join(f"{v:.1f}" for b, v in gbs.items() if b != "new")
                    cells.append((f"{others} → " if others else "") + f"{new:.1f} ({100 * new / read:.0f} %){label}")
                row = f"| {level_} | {name} | {m} | " + " | ".join(cells) + " |"
                print(row, flush=True)
                lines.append(row)
            rows = []
        lines.append("")
    text = "\n".join(lines)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
