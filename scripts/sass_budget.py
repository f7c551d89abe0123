#!/usr/bin/env python3
"""GPU efficiency measured on the CPU: the SASS of every hot CUDA kernel against its budget (no GPU needed).

One-command steps (run from the repository root with any Python ≥ 3.11; needs nvcc and cuobjdump):
    python scripts/sass_budget.py                    # measure, print the table, exit 1 if a kernel is below its floor
    python scripts/sass_budget.py --write-results    # also write benchmarks/results/gpu_sass_budget.md
    python scripts/sass_budget.py --update-floors    # set every floor to today's figure minus the margin
                                                     #   (scripts/sass_budgets.toml, [floors]; review the diff)
    python scripts/sass_budget.py --save-baseline    # keep today's figures as the results' "before" column
                                                     #   (benchmarks/results/gpu_sass_budget_baseline.json: taken
                                                     #   before the kernel rework; leave it as it is after)
    python scripts/sass_budget.py --show 'paged_decode_kernel<__nv_bfloat16, 128, 4>' [--arch sm_80]
                                                     # print the hot loop's instructions
What it does: tests/nvcc/all_kernels.cu (every kernel instance the CUDA backend launches) is compiled to a cubin
per arch (sm_90, sm_80) with the CUDA flags of the module's build; `cuobjdump -sass` gives each kernel's SASS;
scripts/sass_analysis.py finds its hot loop from the control flow and classifies the loop's instructions. Per
kernel: bytes per warp-instruction (memory-bound kernels) or the HMMA issue share (tensor-core kernels), with
registers, spills and occupancy from ptxas, the launch bounds (PTX .maxntid) and the launchers' dynamic shared
memory (tests/nvcc/dyn_smem.cpp). The budgets (kernel patterns, kind, issue target, CI floors) and the GPU
figures of the estimate live in scripts/sass_budgets.toml; tests/test_sass_budget.py holds every kernel to its
floor in CI.

Cache: build/sass_budget/<arch>-<hash of the sources, headers, flags and nvcc version>/ keeps the cubin, the
ptxas report and the measured figures (per hash of the analysis code): a warm run takes seconds; a cold one
compiles all kernels twice (~2 CPU-minutes per arch with nvcc 13).

Estimates, not measurements (no GPU has run these kernels): see ESTIMATE_MODEL below and the results file.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import fnmatch
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: only the table reader needs it
    tomllib = None  # type: ignore[assignment]

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sass_analysis  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "tests" / "nvcc" / "all_kernels.cu"
TABLE = ROOT / "scripts" / "sass_budgets.toml"
RESULTS = ROOT / "benchmarks" / "results" / "gpu_sass_budget.md"
# The figures before the kernel rework ("<arch> <kernel>" → figure): the "before" column of RESULTS.
BASELINE = ROOT / "benchmarks" / "results" / "gpu_sass_budget_baseline.json"
CACHE = ROOT / "build" / "sass_budget"
ARCHS = ("sm_90", "sm_80")
# CUDA flags of the module's build (CMakeLists.txt: C++20, --expt-relaxed-constexpr, -lineinfo, diag 186).
NVCC_FLAGS = ["-std=c++20", "--expt-relaxed-constexpr", "-lineinfo", "-Xcudafe", "--diag_suppress=186",
              "-Xptxas", "-v", "--keep"]
FLOORS_MARKER = "# ---- floors: written by `python scripts/sass_budget.py --update-floors` ----"

ESTIMATE_MODEL = """\
Estimated fraction of the bound (an upper limit set by the issue slots alone; latency, occupancy and shared
memory may cap it lower):
  memory kernels: a GPU of S SMs at clock f issues at most 4·S·f warp-instructions per second (one per SM
    sub-partition per clock), so streaming HBM at B bytes/s needs B / (4·S·f) bytes per warp-instruction
    (H100 SXM: 3.35 TB/s / (4 · 132 · 1.83 GHz) = 3.47; A100: 2.04 TB/s / (4 · 108 · 1.41 GHz) = 3.35).
    fraction = min(1, measured bytes per warp-instruction / needed).
  tensor-core kernels: one mma.sync m16n8k16 (2,048 MACs) keeps a sub-partition's tensor pipe busy for c
    clocks at the mma.sync peak (H100: ~660 TFLOP/s with mma.sync → c ≈ 6; A100: 312 TFLOP/s → c = 8), while
    the scheduler issues one instruction per clock: the pipe can be busy at most c·HMMA / instructions of the
    time. HMMA issue share = c · HMMA / instructions — the figure held in CI (above 100 %: the issue slots
    are not the limit) — and min(1, share) is the fraction of the mma.sync peak the issue slots allow."""


# ---- tools -------------------------------------------------------------------------------------------------

def _first_file(candidates: list[str | None]) -> str | None:
    return next((c for c in candidates if c and os.path.isfile(c) and os.access(c, os.X_OK)), None)


def find_nvcc() -> str | None:
    """The toolkit's nvcc: $CUDA_HOME/bin, /usr/local/cuda*/bin, then PATH (which may hold a wrapper)."""
    toolkits = sorted(map(str, Path("/usr/local").glob("cuda*/bin/nvcc")), reverse=True)
    return _first_file([os.path.join(os.environ.get("CUDA_HOME", ""), "bin", "nvcc"), "/usr/local/cuda/bin/nvcc",
                        *toolkits, shutil.which("nvcc")])


def find_cuobjdump() -> str | None:
    """cuobjdump: $CUOBJDUMP, next to nvcc, on PATH, or the copy inside the triton wheel (a torch dependency) or
    the nvidia-cuda-cuobjdump wheel (a toolkit installed without its binary utilities lacks it)."""
    nvcc = find_nvcc()
    cands: list[str | None] = [os.environ.get("CUOBJDUMP"),
                               os.path.join(os.path.dirname(nvcc), "cuobjdump") if nvcc else None,
                               shutil.which("cuobjdump")]
    for pkg, sub in (("triton", "backends/nvidia/bin"), ("nvidia", "cu13/bin"), ("nvidia", "cuda_cuobjdump/bin")):
        spec = importlib.util.find_spec(pkg)
        for loc in (spec.submodule_search_locations or []) if spec else []:
            cands.append(os.path.join(loc, sub, "cuobjdump"))
    cands += sorted(map(str, ROOT.glob(".venv/lib/python3*/site-packages/triton/backends/nvidia/bin/cuobjdump")))
    return _first_file(cands)


def missing_tools() -> str | None:
    """Why the tool cannot run here, or None."""
    if find_nvcc() is None:
        return "nvcc not found (set CUDA_HOME)"
    if find_cuobjdump() is None:
        return "cuobjdump not found (CUDA toolkit, the triton wheel, or pip install nvidia-cuda-cuobjdump)"
    if shutil.which("c++filt") is None:
        return "c++filt not found (binutils)"
    return None


# ---- compile and measure -----------------------------------------------------------------------------------

@dataclasses.dataclass
class Kernel:
    """One kernel instance on one arch: resources and the steady-state mix of its hot loop per kind of work."""

    name: str  # 'paged_decode_kernel<__nv_bfloat16, 128, 4>' (namespaces and parameters cut)
    arch: str
    registers: int
    spill_bytes: int  # stores + loads
    static_smem: int
    threads: int  # .maxntid (0: no launch bounds)
    dynamic_smem: int
    loops: dict[str, dict | None]  # work kind → LoopMix fields (without the body) or None

    def mix(self, kind: str) -> dict | None:
        return self.loops.get(kind)


def short_name(demangled: str) -> str:
    """'void mk::abi_cuda::k<float, mk::abi_cuda::Tile<64>>(mk::abi_cuda::P<float>)' → 'k<float, Tile<64>>'."""
    name = demangled.removeprefix("void ")
    depth = 0
    for i, c in enumerate(name):  # cut the parameter list: the first '(' outside template brackets
        depth += c == "<"
        depth -= c == ">"
        if c == "(" and depth == 0:
            name = name[:i]
            break
    return re.sub(r"(?<![\w:])(?:\w+::)+", "", name)


def _demangle(names: list[str]) -> list[str]:
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    return [short_name(d) for d in out.split("\n")[:len(names)]]


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(hashlib.sha256(p).digest())
    return h.hexdigest()[:16]


def source_key(source: Path, arch: str, nvcc: str) -> str:
    """Hash of what the cubin depends on: the source, every header under csrc/, the flags, nvcc's version."""
    headers = sorted(p for p in (ROOT / "csrc").rglob("*") if p.suffix in (".h", ".cuh", ".hpp"))
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    return _digest(source.read_bytes(), *(str(p.relative_to(ROOT)).encode() + p.read_bytes() for p in headers),
                   " ".join([arch, *NVCC_FLAGS]).encode(), version.encode())


METRICS_VERSION = b"1"  # bump when _analyse or Kernel change what a cached metrics file holds


def analysis_key() -> str:
    return _digest(Path(sass_analysis.__file__).read_bytes(), METRICS_VERSION)


def compile_cubin(source: Path, arch: str, out: Path) -> None:
    """source → out/k.cubin, out/ptxas.txt (ptxas -v), out/*.ptx (kept for .maxntid)."""
    nvcc = find_nvcc()
    assert nvcc, "nvcc not found"
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}-{threading.get_ident()}")  # two compiles may race
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    cmd = [nvcc, *NVCC_FLAGS, "--keep-dir", str(tmp), f"-I{ROOT / 'csrc'}", f"-arch={arch}", "-cubin", str(source),
           "-o", str(tmp / "k.cubin")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"nvcc failed for {source.name} on {arch}:\n{r.stderr[-4000:]}")
    (tmp / "ptxas.txt").write_text(r.stdout + r.stderr)
    for p in tmp.iterdir():  # keep only what is read back
        if p.suffix not in (".cubin", ".txt", ".ptx"):
            p.unlink()
    try:
        tmp.rename(out)
    except OSError:  # another process finished the same compile first: keep its copy
        shutil.rmtree(tmp, ignore_errors=True)


def _resources(out: Path) -> dict[str, tuple[int, int, int, int]]:
    """mangled name → (registers, spill bytes, static smem, threads) from the ptxas report and the PTX."""
    report = (out / "ptxas.txt").read_text()
    threads: dict[str, int] = {}
    for ptx in out.glob("*.ptx"):
        for m in re.finditer(r"\.entry (\S+)\((.*?)\{", ptx.read_text(), re.DOTALL):
            ntid = re.search(r"\.maxntid (\d+), (\d+), (\d+)", m.group(2))
            threads[m.group(1)] = int(ntid[1]) * int(ntid[2]) * int(ntid[3]) if ntid else 0
    res = {}
    blocks = re.split(r"ptxas info\s*: Compiling entry function '([^']+)' for '(sm_\d+)'", report)
    for i in range(1, len(blocks) - 2, 3):
        text = blocks[i + 2]
        spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
        regs = re.search(r"Used (\d+) registers", text)
        smem = re.search(r"(\d+) bytes smem", text)
        if not (spill and regs):
            raise RuntimeError(f"unparsed ptxas report for {blocks[i]}:\n{text[:2000]}")
        res[blocks[i]] = (int(regs[1]), int(spill[1]) + int(spill[2]), int(smem[1]) if smem else 0,
                          threads.get(blocks[i], 0))
    return res


def dynamic_smem() -> dict[str, int]:
    """Kernel name → the largest dynamic shared memory its launcher requests (tests/nvcc/dyn_smem.cpp, g++ with
    the emulator's headers; cached by the hash of csrc/)."""
    gxx = shutil.which("g++")
    if gxx is None:
        return {}
    key = _digest(*(p.read_bytes() for p in sorted((ROOT / "csrc").rglob("*")) if p.is_file()),
                  (ROOT / "tests" / "nvcc" / "dyn_smem.cpp").read_bytes())
    cached = CACHE / f"dyn_smem-{key}.json"
    if cached.exists():
        return json.loads(cached.read_text())
    CACHE.mkdir(parents=True, exist_ok=True)
    exe = CACHE / f"dyn_smem-{key}-{os.getpid()}-{threading.get_ident()}"
    cmd = [gxx, "-std=c++20", "-O0", "-Wno-unknown-pragmas", f"-I{ROOT / 'csrc'}",
           str(ROOT / "tests" / "nvcc" / "dyn_smem.cpp"), *map(str, sorted((ROOT / "csrc" / "simt").glob("emu_*.cpp"))),
           "-lpthread", "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"g++ failed on tests/nvcc/dyn_smem.cpp:\n{r.stderr[-3000:]}")
    lines = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.splitlines()
    exe.unlink()
    out = {name: int(b) for name, b in (line.split("\t") for line in lines)}
    tmp = cached.with_name(f"{cached.name}.{os.getpid()}-{threading.get_ident()}")
    tmp.write_text(json.dumps(out))
    tmp.replace(cached)
    return out


def compiled(source: Path, arch: str) -> Path:
    """The cache directory holding source's cubin for arch (k.cubin, ptxas.txt: the -Xptxas -v report, the
    .ptx), compiled first if the sources, flags or nvcc changed. tests/test_nvcc_ptxas.py reads it too."""
    nvcc = find_nvcc()
    if nvcc is None:
        raise RuntimeError("nvcc not found (set CUDA_HOME)")
    out = CACHE / f"{source.stem}-{arch}-{source_key(source, arch, nvcc)}"
    if not (out / "k.cubin").exists():
        compile_cubin(source, arch, out)
    return out


def measure(source: Path = SOURCE, arch: str = "sm_90", select: str = "*") -> dict[str, Kernel]:
    """Kernel name → Kernel for every kernel of `source` on `arch` whose name matches the glob `select`
    (compiled and analysed once per source hash; cached under build/sass_budget)."""
    why = missing_tools()
    if why:
        raise RuntimeError(why)
    out = compiled(source, arch)
    metrics = out / f"metrics-{analysis_key()}.json"
    if not metrics.exists():
        tmp = metrics.with_name(f"{metrics.name}.{os.getpid()}-{threading.get_ident()}")
        tmp.write_text(json.dumps(_analyse(out, arch, source == SOURCE)))
        tmp.replace(metrics)
    kernels = {k["name"]: Kernel(**k) for k in json.loads(metrics.read_text())}
    return {n: k for n, k in kernels.items() if fnmatch.fnmatchcase(n, select)}


def _sass_text(cubin: Path) -> subprocess.Popen:
    cuobjdump = find_cuobjdump()
    assert cuobjdump
    return subprocess.Popen([cuobjdump, "-sass", str(cubin)], stdout=subprocess.PIPE, text=True, bufsize=1 << 20)


def _analyse(out: Path, arch: str, with_dynamic: bool) -> list[dict]:
    res = _resources(out)
    dyn = dynamic_smem() if with_dynamic else {}
    proc = _sass_text(out / "k.cubin")
    assert proc.stdout
    found: list[tuple[str, dict[str, dict | None]]] = []
    for mangled, code in sass_analysis.functions(proc.stdout):
        mixes = {}
        for work in sass_analysis.WORK:
            m = sass_analysis.hot_loop(code, work)
            mixes[work] = None if m is None else {f.name: getattr(m, f.name) for f in dataclasses.fields(m)
                                                  if f.name != "body"}
        found.append((mangled, mixes))
    if proc.wait() != 0:
        raise RuntimeError(f"cuobjdump -sass failed on {out / 'k.cubin'}")
    names = _demangle([m for m, _ in found])
    kernels = []
    for (mangled, mixes), name in zip(found, names):
        regs, spill, smem, threads = res.get(mangled, (0, 0, 0, 0))
        kernels.append(dataclasses.asdict(Kernel(name, arch, regs, spill, smem, threads, dyn.get(name, 0), mixes)))
    return kernels


def hot_loop_listing(source: Path, arch: str, name: str, kind: str) -> list[str]:
    """The hot loop's instructions of one kernel (for --show)."""
    proc = _sass_text(compiled(source, arch) / "k.cubin")
    assert proc.stdout
    funcs = list(sass_analysis.functions(proc.stdout))
    proc.wait()
    for (_, code), short in zip(funcs, _demangle([m for m, _ in funcs])):
        if short == name:
            m = sass_analysis.hot_loop(code, kind)
            return m.body if m else ["(no hot loop)"]
    raise KeyError(f"no kernel named {name!r} on {arch}")


# ---- budgets -----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Family:
    pattern: str  # fnmatch glob on the kernel name
    kind: str  # "memory" | "tensor"
    header: str
    target: float | None  # the target, in the figure's unit
    target_note: str
    requested_is_hbm: bool = True  # False: broadcast loads make requested bytes ≠ HBM bytes (no fraction estimate)


@dataclasses.dataclass(frozen=True)
class Gpu:
    name: str
    hbm_bytes_per_s: float
    sms: int
    clock_hz: float
    hmma_clocks: float  # c: clocks one HMMA.16816 keeps a sub-partition's tensor pipe busy at the mma.sync peak
    smem_per_sm: int
    regs_per_sm: int = 65536
    max_warps: int = 64
    max_blocks: int = 32

    @property
    def bytes_per_instr_needed(self) -> float:
        return self.hbm_bytes_per_s / (4 * self.sms * self.clock_hz)


@dataclasses.dataclass
class Table:
    gpus: dict[str, Gpu]  # arch → GPU of the estimate
    families: list[Family]
    floors: dict[tuple[str, str], float]  # (arch, kernel) → CI floor
    margin: float

    def family(self, name: str) -> Family | None:
        return next((f for f in self.families if fnmatch.fnmatchcase(name, f.pattern)), None)


def load_table(path: Path = TABLE) -> Table:
    if tomllib is None:
        raise RuntimeError(f"reading {path} needs Python ≥ 3.11 (tomllib)")
    data = tomllib.loads(path.read_text())
    gpus = {arch: Gpu(**g) for arch, g in data["gpu"].items()}
    fams = [Family(f["pattern"], f["kind"], f["header"], f.get("target"), f.get("target_note", ""),
                   f.get("requested_is_hbm", True)) for f in data["family"]]
    for f in fams:
        if f.kind not in ("memory", "tensor"):
            raise ValueError(f"{path}: family {f.pattern!r}: kind must be 'memory' or 'tensor', got {f.kind!r}")
    floors = {}
    for key, value in data.get("floors", {}).items():
        arch, _, name = key.partition(" ")
        floors[(arch, name)] = float(value)
    return Table(gpus, fams, floors, float(data["margin"]))


@dataclasses.dataclass
class Row:
    """One budgeted kernel instance on one arch."""

    kernel: Kernel
    family: Family
    figure: float  # bytes per warp-instruction, or HMMA issue share
    fraction: float | None  # estimated fraction of the bound (None: no estimate, see Family.requested_is_hbm)
    floor: float | None
    occupancy_warps: int
    instructions: int
    work: float  # bytes or HMMA per iteration
    by_class: dict[str, int]

    @property
    def ok(self) -> bool:
        return self.floor is None or self.figure >= self.floor

    def violation(self) -> str:
        unit = "bytes/warp-instr" if self.family.kind == "memory" else "HMMA issue share"
        return (f"{self.kernel.name} on {self.kernel.arch}: {unit} {self.figure:.3f} < floor {self.floor:.3f} "
                f"(target {self.family.target}; {self.instructions} instructions per hot-loop iteration)")


def occupancy(k: Kernel, gpu: Gpu) -> int:
    """Resident warps per SM (0 when unknown: no launch bounds)."""
    if not k.threads:
        return 0
    warps = -(-k.threads // 32)
    per_warp_regs = -(-max(k.registers, 1) * 32 // 256) * 256
    by_regs = gpu.regs_per_sm // (per_warp_regs * warps)
    smem = k.static_smem + k.dynamic_smem
    by_smem = gpu.smem_per_sm // (smem + 1024) if smem else gpu.max_blocks  # 1 KiB reserved per block
    blocks = min(by_regs, by_smem, gpu.max_warps // warps, gpu.max_blocks)
    return blocks * warps


def figure_of(kind: str, mix: dict, gpu: Gpu) -> tuple[float, float, float]:
    """(budget figure, estimated fraction of the bound, work per iteration) of one hot-loop mix."""
    n = mix["instructions"]
    if kind == "memory":
        bpi = mix["global_bytes"] / n
        return bpi, min(1.0, bpi / gpu.bytes_per_instr_needed), mix["global_bytes"]
    share = gpu.hmma_clocks * mix["hmma"] / n  # not capped: a regression above 100 % still shows
    return share, min(1.0, share), mix["hmma"]


def evaluate(kernels: dict[str, Kernel], table: Table) -> list[Row]:
    rows = []
    for k in kernels.values():
        fam = table.family(k.name)
        if fam is None or k.arch not in table.gpus:
            continue
        mix = k.mix(fam.kind)
        if mix is None:  # no loop carrying this work (fp32 instances of the tensor-core families)
            continue
        gpu = table.gpus[k.arch]
        fig, frac, work = figure_of(fam.kind, mix, gpu)
        rows.append(Row(k, fam, fig, frac if fam.requested_is_hbm else None, table.floors.get((k.arch, k.name)),
                        occupancy(k, gpu),
                        mix["instructions"], work, mix["by_class"]))
    return sorted(rows, key=lambda r: (table.families.index(r.family), ARCHS.index(r.kernel.arch), r.kernel.name))


def measure_all(archs: tuple[str, ...] = ARCHS) -> dict[str, Kernel]:
    """Every kernel of all_kernels.cu on every arch, keyed 'arch name'."""
    with concurrent.futures.ThreadPoolExecutor(len(archs)) as pool:
        parts = list(pool.map(lambda a: measure(SOURCE, a), archs))
    return {f"{k.arch} {k.name}": k for part in parts for k in part.values()}


# ---- output ------------------------------------------------------------------------------------------------

def write_floors(rows: list[Row], table: Table, path: Path = TABLE) -> int:
    """Rewrite the [floors] section: every budgeted instance at its figure minus the margin. Returns the count."""
    text = path.read_text()
    head = text.split(FLOORS_MARKER)[0].rstrip() + "\n\n"
    lines = [FLOORS_MARKER, "# key: \"<arch> <kernel>\"; value: the CI floor (figure × (1 - margin), rounded down)",
             "[floors]"]
    for r in rows:
        floor = int(r.figure * (1 - table.margin) * 1000) / 1000
        lines.append(f"{json.dumps(r.kernel.arch + ' ' + r.kernel.name)} = {floor}")
    path.write_text(head + "\n".join(lines) + "\n")
    return len(rows)


def _target(fam: Family) -> str:
    """The family's target; in HBM bytes (not comparable with the requested-bytes figure) where they differ."""
    text = _fmt(fam.target, fam.kind == "tensor")
    return text if fam.requested_is_hbm or fam.target is None else f"{text} HBM B/instr (figure: requested)"


def _fmt(x: float | None, pct: bool = False) -> str:
    if x is None:
        return "—"
    return f"{100 * x:.0f} %" if pct else f"{x:.2f}"


# The instances the design estimates were counted by hand on (sm_90 SASS, nvcc 13): kernel → what was counted.
HAND_COUNTS = {
    "paged_decode_kernel<__nv_bfloat16, 128, 4>": "~1,260 instructions per 4 KB of K+V (GQA 4)",
    "paged_prefill_tc_kernel<__nv_bfloat16, 128>": "~850 instructions per 32-key tile, HMMA share ~41-45 %",
    "grouped_gemm_tc_kernel<__nv_bfloat16, GemmTcTile<128, 128, 32, 2, 4, 3, 2>, false>":
        "~300 instructions per k-tile, HMMA share ~76 %",
    "quant_gemm_kernel<__nv_bfloat16, 12>": "~1,220 instructions per 32 HMMA, HMMA share ~16-19 %",
    "quant_gemv_kernel<__nv_bfloat16, 12, 1>": "1.1 HBM bytes per warp-instruction (Q4_K, M = 1)",
    "quant_gemv_kernel<__nv_bfloat16, 3, 1>": "1.6 HBM bytes per warp-instruction (Q4_1, M = 1)",
    "quant_gemv_kernel<__nv_bfloat16, 8, 1>": "3.2 HBM bytes per warp-instruction (Q8_0, M = 1)",
}


def _summary(rows: list[Row], table: Table, before: dict[str, float]) -> list[str]:
    out = ["## Summary: the lowest figure per family (sm_90)", "",
           "| family | lowest instance | figure | before | est. fraction of bound | target |",
           "|---|---|---|---|---|---|"]
    for fam in table.families:
        frows = [r for r in rows if r.family is fam and r.kernel.arch == "sm_90"]
        if frows:
            r = min(frows, key=lambda r: r.figure)
            pct = fam.kind == "tensor"
            was = before.get(f"{r.kernel.arch} {r.kernel.name}")
            out.append(f"| `{fam.pattern}` | `{r.kernel.name}` | {_fmt(r.figure, pct)} | {_fmt(was, pct)} | "
                       f"{_fmt(r.fraction, True)} | {_target(fam)} |")
    out += ["", "## Against the hand counts of the design review (sm_90)", "",
            "| kernel | hand count | tool: instructions per iteration | tool: figure |", "|---|---|---|---|"]
    by_name = {r.kernel.name: r for r in rows if r.kernel.arch == "sm_90"}
    for name, counted in HAND_COUNTS.items():
        r = by_name.get(name)
        if r:
            pct = r.family.kind == "tensor"
            per = f"{r.instructions} ({r.work:.0f} {'B' if r.family.kind == 'memory' else 'HMMA'})"
            out.append(f"| `{name}` | {counted} | {per} | {_fmt(r.figure, pct)} |")
    return out + [""]


def results_markdown(rows: list[Row], table: Table, before: dict[str, float] | None = None) -> str:
    """The results file; `before`: the baseline figures ("<arch> <kernel>" → figure), shown next to today's."""
    before = before or {}
    nvcc = find_nvcc() or "?"
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    out = ["# SASS budgets: GPU efficiency estimated from the compiled kernels (no GPU run)", "",
           "Written by `python scripts/sass_budget.py --write-results` from `tests/nvcc/all_kernels.cu` compiled with",
           f"nvcc ({version}) for sm_90 and sm_80. Every figure is static: the instructions of one steady-state",
           "iteration of each kernel's hot loop (found from the control flow, scripts/sass_analysis.py). The",
           "fraction of the bound is an **estimate**; a GPU run (scripts/gpu_check.sh) measures the real one.", "",
           "Figures: memory kernels — bytes a warp requests from global memory per warp-instruction in the hot",
           "loop (LDG/LDGSTS width × 32 lanes); tensor-core kernels — the HMMA issue share (below). Floor: what CI",
           "(tests/test_sass_budget.py) holds the kernel to; target: the figure the kernel's redesign aims for;",
           "before: the figure of the code before the kernel rework (benchmarks/results/gpu_sass_budget_baseline.json).",
           "Warps/SM: resident warps per SM from registers, shared memory (static + the launcher's dynamic) and",
           "the launch bounds.", "", "```", ESTIMATE_MODEL, "```", "",
           "Caveat (quantized GEMV): its scale and metadata bytes are loaded per lane (sub-word LDGs whose",
           "addresses the lanes of a block share); the hardware serves such a broadcast once, so the requested",
           "bytes over-state the HBM bytes until the loads become lane-distinct 16-byte vectors. Today, per 8",
           "weights and weight row: Q4_K requests 14 B for 4.5 B of HBM data (Q4_1 ~8 B for 5 B, Q8_0 ~10 B for",
           "8.5 B): the HBM bytes per warp-instruction are about 1.1 (Q4_K), 1.6 (Q4_1), 3.2 (Q8_0) at M = 1.", "",
           "Caveat (nested loops): a loop nested in the hot loop counts one trip (trip counts are not known",
           "statically). Where a copy loop runs more trips per tile than that — the K/V gather of",
           "paged_prefill_tc (at D 128: 4 chunks of K+V per thread and tile, 3 on the counted path, ~90",
           "instructions per chunk), the x-tile copy of quant_gemm — the tensor-core figures are optimistic by",
           "those instructions (prefill_tc bf16 D 128: 45 % counted, ~41 % with the fourth chunk).", ""]
    out += _summary(rows, table, before)
    for fam in table.families:
        frows = [r for r in rows if r.family is fam]
        if not frows:
            continue
        unit = "B/instr" if fam.kind == "memory" else "HMMA share"
        work = "B/iter" if fam.kind == "memory" else "HMMA/iter"
        out += [f"## `{fam.pattern}` ({fam.kind}, {fam.header})", "",
                f"Target: {_fmt(fam.target, fam.kind == 'tensor') if fam.target else 'none set'}"
                f"{' — ' + fam.target_note if fam.target_note else ''}", "",
                f"| kernel | arch | {unit} | before | floor | target | est. fraction of bound | instr/iter | {work} | "
                "mem / int / fp / conv / ctl | regs | spill B | warps/SM |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in frows:
            pct = fam.kind == "tensor"
            c = r.by_class
            was = before.get(f"{r.kernel.arch} {r.kernel.name}")
            out.append(f"| `{r.kernel.name}` | {r.kernel.arch} | {_fmt(r.figure, pct)} | {_fmt(was, pct)} | "
                       f"{_fmt(r.floor, pct)} | "
                       f"{_target(fam)} | {_fmt(r.fraction, True)} | {r.instructions} | {r.work:.0f} | "
                       f"{c['memory']} / {c['int']} / {c['fp']} / {c['conversion']} / {c['control']} | "
                       f"{r.kernel.registers} | {r.kernel.spill_bytes} | {r.occupancy_warps} |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write-results", action="store_true", help=f"write {RESULTS.relative_to(ROOT)}")
    ap.add_argument("--update-floors", action="store_true", help="set the floors in the table to today's figures")
    ap.add_argument("--save-baseline", action="store_true",
                    help=f"keep today's figures as the 'before' column ({BASELINE.relative_to(ROOT)})")
    ap.add_argument("--show", metavar="KERNEL", help="print the hot loop of one kernel instance")
    ap.add_argument("--arch", default="sm_90", choices=ARCHS)
    args = ap.parse_args(argv)
    why = missing_tools()
    if why:
        print(f"sass_budget: {why}", file=sys.stderr)
        return 2
    table = load_table()
    if args.show:
        fam = table.family(args.show)
        kind = fam.kind if fam else "any"
        try:
            print("\n".join(hot_loop_listing(SOURCE, args.arch, args.show, kind)))
        except KeyError as e:
            print(f"sass_budget: {e.args[0]} (names as in benchmarks/results/gpu_sass_budget.md)", file=sys.stderr)
            return 2
        return 0
    rows = evaluate(measure_all(), table)
    if args.update_floors:
        n = write_floors(rows, table)
        print(f"wrote {n} floors to {TABLE.relative_to(ROOT)} (margin {table.margin:.0%})")
        table = load_table()
        rows = evaluate(measure_all(), table)
    for r in rows:
        pct = r.family.kind == "tensor"
        mark = "" if r.ok else "  BELOW FLOOR"
        print(f"{r.kernel.arch} {r.kernel.name:70s} {_fmt(r.figure, pct):>8s} floor {_fmt(r.floor, pct):>8s} "
              f"est {_fmt(r.fraction, True):>5s} instr {r.instructions:5d} warps {r.occupancy_warps:2d}{mark}")
    if args.save_baseline:
        BASELINE.write_text(json.dumps({f"{r.kernel.arch} {r.kernel.name}": round(r.figure, 4) for r in rows},
                                       indent=0, sort_keys=True) + "\n")
        print(f"wrote {BASELINE.relative_to(ROOT)}")
    if args.write_results:
        before = json.loads(BASELINE.read_text()) if BASELINE.exists() else {}
        RESULTS.write_text(results_markdown(rows, table, before))
        print(f"wrote {RESULTS.relative_to(ROOT)}")
    bad = [r for r in rows if not r.ok]
    for r in bad:
        print("below floor: " + r.violation(), file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
