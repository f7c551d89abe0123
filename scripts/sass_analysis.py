"""SASS of one kernel → its control flow, its loops, and the instruction mix of the hot loop (no GPU needed).

Input: the text `cuobjdump -sass` prints for a cubin. Per function: the instructions (address, guard predicate,
opcode, operands), the basic blocks, the dominator tree, the natural loops (a back edge is a branch to a block
that dominates the branch; the loop is every block that reaches the branch without passing its header), and
for the hot loop the instructions of one steady-state iteration, classified (memory / tensor / fp / int /
control / conversion / other) with the bytes its global loads move per warp.

Hot loop (`hot_loop`): the innermost loop carrying the kernel's work — global loads for a memory-bound kernel,
tensor-core instructions for a tensor-core one — and of several such loops the one with the most work per
iteration. A loop of other work nested in it (a gather loop inside a tensor-core tile loop) counts one trip.
Steady-state path of a loop (`steady_path`): of the paths from the header to a back edge, with the back edges
of inner loops cut and the out-of-line `BRA.DIV` targets (the divergent fall-back of warp collectives, taken
only when the warp is not converged) left out, the one doing the most work, and of those the longest — every
guarded block that does not change the work counts, so a rare fix-up on the path (a NaN check) costs its
instructions in the figure, and a rare block that adds work (a block-table refresh: 128 bytes) is counted too.

Units: instructions are warp instructions (one issue slot of a warp scheduler each); bytes are what a warp
requests (a load's width × 32 lanes): lanes that share an address (a broadcast of a block's scale) each count,
so for such loads the figure over-states the bytes DRAM delivers.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator

# Instruction classes, by opcode (the part before the first '.'). Memory covers every load / store unit op
# (global, shared, local, constant, async copies, matrix loads); LDG-family widths give the global bytes. int
# is integer / address arithmetic with moves, predicates, shuffles and votes (bookkeeping); conversion holds
# the type conversions and byte permutes; other is whatever is not listed (none in today's kernels).
CLASSES: dict[str, tuple[str, ...]] = {
    "memory": ("LDG", "STG", "LDS", "STS", "LDL", "STL", "LD", "ST", "LDC", "ULDC", "LDGSTS", "LDSM", "STSM",
               "ATOM", "ATOMG", "ATOMS", "RED", "REDG", "LDGDEPBAR", "DEPBAR", "UBLKCP", "UTMALDG", "UTMASTG",
               "SULD", "SUST", "TLD", "TEX", "CCTL", "MATCH"),
    "tensor": ("HMMA", "IMMA", "DMMA", "BMMA", "HGMMA", "IGMMA", "QGMMA", "BGMMA"),
    "fp": ("FFMA", "FADD", "FMUL", "FMNMX", "FSETP", "FSET", "FSEL", "FCHK", "MUFU", "HFMA2", "HADD2", "HMUL2",
           "HMNMX2", "HSETP2", "HSET2", "DFMA", "DADD", "DMUL", "DSETP", "FSWZADD", "FMNMX3"),
    "int": ("IMAD", "IADD3", "IADD", "LEA", "SHF", "SHL", "SHR", "LOP3", "LOP", "ISETP", "IMNMX", "IABS", "POPC",
            "FLO", "BREV", "SEL", "MOV", "UMOV", "UIADD3", "UIMAD", "ULEA", "USHF", "ULOP3", "UISETP", "USEL",
            "UIMNMX", "USHL", "USHR", "IDP", "IDP4A", "VIADD", "VIMNMX", "VIMNMX3", "IMUL", "IMNMX3", "ISCADD",
            "PLOP3", "UPLOP3", "P2R", "R2P", "CS2R", "S2R", "S2UR", "R2UR", "UP2UR", "SHFL", "VOTE", "VOTEU",
            "UFLO", "UPOPC", "UBREV", "LEPC", "BMSK", "UBMSK", "SGXT", "USGXT", "VABSDIFF", "VABSDIFF4", "XMAD",
            "VIADDMNMX", "UVIADD", "UVIMNMX"),
    "control": ("BRA", "BRX", "JMP", "JMX", "CALL", "RET", "EXIT", "BAR", "BSSY", "BSYNC", "WARPSYNC", "NANOSLEEP",
                "BREAK", "BPT", "KILL", "YIELD", "NOP", "MEMBAR", "ERRBAR", "FENCE", "ACQBULK", "ELECT",
                "ENDCOLLECTIVE", "WARPGROUP", "SYNCS", "ACQSHMINIT", "CGAERRBAR", "UCGABAR_ARV", "UCGABAR_WAIT", "B2R", "R2B"),
    "conversion": ("F2F", "F2I", "I2F", "I2I", "F2FP", "I2FP", "F2IP", "FRND", "PRMT", "UPRMT", "F2UP", "HADD2_F32"),
}
_CLASS_OF = {op: cls for cls, ops in CLASSES.items() for op in ops}
_BRANCHES = {"BRA", "BRX", "JMP", "JMX"}
_ENDS = {"EXIT", "RET", "KILL"}
_LOAD_GLOBAL = {"LDG", "LDGSTS"}  # global → register / shared: the bytes a memory-bound loop streams
_WIDTH = {"U8": 1, "S8": 1, "U16": 2, "S16": 2, "32": 4, "64": 8, "128": 16, "LTC128B": 16}

_INSTR = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Z0-9_]+)*)(.*?)\s*;")
_FUNCTION = re.compile(r"^\s+Function : (\S+)")
_TARGET = re.compile(r"0x([0-9a-f]+)\s*$")


def classify(op: str) -> str:
    """Instruction class of an opcode without its modifiers ('LDG', not 'LDG.E.128')."""
    return _CLASS_OF.get(op, "other")


@dataclasses.dataclass(frozen=True)
class Instr:
    addr: int
    guard: str  # '@P0', '@!P1', '' (none)
    op: str  # opcode without modifiers: 'LDG'
    mods: tuple[str, ...]  # ('E', '128')
    operands: str

    @property
    def cls(self) -> str:
        return classify(self.op)

    def global_load_bytes(self) -> int:
        """Bytes a warp moves from global memory with this instruction (32 lanes × width); 0 if not a load."""
        if self.op not in _LOAD_GLOBAL:
            return 0
        widths = [_WIDTH[m] for m in self.mods if m in _WIDTH]
        if self.op == "LDGSTS":  # LDGSTS.E.BYPASS.LTC128B.128: the copy width is the last size modifier
            return 32 * (widths[-1] if widths else 4)
        return 32 * (max(widths) if widths else 4)

    @property
    def text(self) -> str:
        return f"{self.guard + ' ' if self.guard else ''}{'.'.join((self.op, *self.mods))}{self.operands}"


def functions(sass: Iterator[str]) -> Iterator[tuple[str, list[Instr]]]:
    """(mangled name, instructions) of every function in `cuobjdump -sass` text, in file order."""
    name, body = None, []
    for line in sass:
        if line.startswith("        /*"):
            m = _INSTR.match(line)
            if m:
                guard = m[2].strip() if m[2] else ""
                mods = tuple(m[4].split(".")[1:]) if m[4] else ()
                body.append(Instr(int(m[1], 16), guard, m[3], mods, m[5]))
            continue
        f = _FUNCTION.match(line)
        if f:
            if name is not None:
                yield name, body
            name, body = f[1], []
    if name is not None:
        yield name, body


@dataclasses.dataclass
class Block:
    start: int  # index of the first instruction
    end: int  # one past the last
    succ: list[int] = dataclasses.field(default_factory=list)  # successor blocks
    cold: set[int] = dataclasses.field(default_factory=set)  # successors reached only off the steady state


def _target(ins: Instr) -> int | None:
    m = _TARGET.search(ins.operands)
    return int(m[1], 16) if m else None


def blocks(code: list[Instr]) -> list[Block]:
    """Basic blocks of a function, in address order, with their successor edges."""
    index = {ins.addr: i for i, ins in enumerate(code)}
    leaders = {0}
    for i, ins in enumerate(code):
        if ins.op in _BRANCHES or ins.op in _ENDS:
            leaders.add(i + 1)
            t = _target(ins) if ins.op == "BRA" else None
            if t is not None and t in index:
                leaders.add(index[t])
    starts = sorted(s for s in leaders if s < len(code))
    out = [Block(s, e) for s, e in zip(starts, [*starts[1:], len(code)])]
    block_of = {b.start: n for n, b in enumerate(out)}
    for n, b in enumerate(out):
        last = code[b.end - 1]
        conditional = bool(last.guard) and last.guard != "@PT"
        if last.op == "BRA":
            t = _target(last)
            if t is not None and t in index:
                out[n].succ.append(block_of[index[t]])
                if "DIV" in last.mods:  # BRA.DIV: the divergent fall-back of a warp collective
                    out[n].cold.add(block_of[index[t]])
            conditional = conditional or "DIV" in last.mods or bool(re.match(r"\s*!?U?P\d", last.operands))  # BRA P0, …
            if conditional and n + 1 < len(out):
                out[n].succ.append(n + 1)
        elif last.op in _BRANCHES or last.op in _ENDS:
            if conditional and n + 1 < len(out):
                out[n].succ.append(n + 1)
        elif n + 1 < len(out):
            out[n].succ.append(n + 1)
    return out


def dominators(bl: list[Block]) -> list[int]:
    """Immediate dominator of each block (entry: itself; unreachable: -1) — Cooper, Harvey & Kennedy."""
    order, seen = [], set()
    stack = [(0, iter(bl[0].succ))] if bl else []
    seen.add(0)
    while stack:  # reverse postorder by an iterative DFS
        node, it = stack[-1]
        nxt = next((s for s in it if s not in seen), None)
        if nxt is None:
            order.append(node)
            stack.pop()
        else:
            seen.add(nxt)
            stack.append((nxt, iter(bl[nxt].succ)))
    rpo = order[::-1]
    pos = {b: i for i, b in enumerate(rpo)}
    preds: list[list[int]] = [[] for _ in bl]
    for n, b in enumerate(bl):
        for s in b.succ:
            preds[s].append(n)
    idom = [-1] * len(bl)
    if bl:
        idom[0] = 0
    changed = True
    while changed:
        changed = False
        for b in rpo[1:]:
            ps = [p for p in preds[b] if idom[p] != -1]
            new = ps[0]
            for p in ps[1:]:
                x, y = p, new
                while x != y:
                    while pos[x] > pos[y]:
                        x = idom[x]
                    while pos[y] > pos[x]:
                        y = idom[y]
                new = x
            if idom[b] != new:
                idom[b] = new
                changed = True
    return idom


def _dominates(idom: list[int], a: int, b: int) -> bool:
    while True:
        if a == b:
            return True
        if b == 0 or idom[b] == -1 or idom[b] == b:
            return False
        b = idom[b]


@dataclasses.dataclass
class Loop:
    header: int  # block
    latches: list[int]  # blocks with a back edge to the header
    body: set[int]  # blocks

    def contains(self, other: Loop) -> bool:
        return other is not self and other.body <= self.body and other.header != self.header


def loops(bl: list[Block]) -> list[Loop]:
    """Natural loops (one per header: the back edges to a header merge)."""
    idom = dominators(bl)
    preds: list[list[int]] = [[] for _ in bl]
    for n, b in enumerate(bl):
        for s in b.succ:
            preds[s].append(n)
    by_header: dict[int, Loop] = {}
    for n, b in enumerate(bl):
        if idom[n] == -1:
            continue
        for h in b.succ:
            if _dominates(idom, h, n):
                loop = by_header.setdefault(h, Loop(h, [], {h}))
                loop.latches.append(n)
                work = [n]
                while work:
                    x = work.pop()
                    if x not in loop.body:
                        loop.body.add(x)
                        work.extend(preds[x])
    return list(by_header.values())


def work_of(ins: Instr, work: str) -> int:
    """Work units of one instruction: global bytes ("memory"), tensor instructions ("tensor"), 1 ("any")."""
    if work == "memory":
        return ins.global_load_bytes()
    if work == "tensor":
        return int(ins.cls == "tensor")
    return 1


def steady_path(code: list[Instr], bl: list[Block], loop: Loop, work: str) -> list[Instr]:
    """Instructions of the loop's steady-state iteration (see the module docstring): of the header → back-edge
    paths, the one that does the most work (`work_of`), and of those the longest (every guarded block of
    the iteration counted: rare fix-ups such as a table refresh or a NaN path make the figure pessimistic,
    never optimistic, as long as they do no more work than the steady-state path).

    The loop's blocks form a DAG once the back edges are cut: the edges to the header end an iteration, an
    edge to a lower block inside the loop is an inner loop's back edge (the inner loop counts once), an edge
    leaving the loop is an exit. nvcc lays a loop out from its header onwards, so the DAG's topological order
    is the address order."""
    best: dict[int, tuple[int, int, int]] = {}  # block → (work, instructions) to the back edge, next block
    for n in sorted(loop.body, reverse=True):
        options = []
        for s in bl[n].succ:
            if s in bl[n].cold:
                continue
            if s == loop.header:
                options.append((0, 0, -1))
            elif s in loop.body and s > n and s in best:
                options.append((best[s][0], best[s][1], s))
        if options:
            w, length, nxt = max(options)
            own = code[bl[n].start:bl[n].end]
            best[n] = (w + sum(work_of(i, work) for i in own), length + len(own), nxt)
    path: list[Instr] = []
    n = loop.header if loop.header in best else -1
    while n != -1:
        path.extend(code[bl[n].start:bl[n].end])
        n = best[n][2]
    return path


@dataclasses.dataclass
class LoopMix:
    """One steady-state iteration of a function's hot loop."""

    instructions: int
    by_class: dict[str, int]
    global_bytes: int  # per warp
    hmma: int  # tensor-core instructions
    first_addr: int
    last_addr: int
    loops: int  # natural loops in the function
    body: list[str]  # instruction texts (for --show)

    @property
    def bytes_per_instr(self) -> float:
        return self.global_bytes / self.instructions if self.instructions else 0.0

    @property
    def hmma_share(self) -> float:
        return self.hmma / self.instructions if self.instructions else 0.0


WORK = ("memory", "tensor", "any")


def hot_loop(code: list[Instr], work: str = "any") -> LoopMix | None:
    """The hot loop's steady-state mix, or None for a function without such a loop.

    The hot loop is the innermost loop that carries the kernel's work — `work` "memory": global loads on its
    steady-state path; "tensor": tensor-core instructions; "any": every loop — innermost among those loops
    (no other such loop inside it), and of several the one with the most work per iteration (bytes, tensor
    instructions, instructions), then the most instructions. A loop of other work nested inside (a gather loop
    in a tensor-core tile loop) counts once per iteration of the hot loop."""
    if work not in WORK:
        raise ValueError(f"work must be one of {WORK}, got {work!r}")
    bl = blocks(code)
    found = [lp for lp in loops(bl) if sum(bl[b].end - bl[b].start for b in lp.body) > 1]  # not the trap `BRA .`
    paths = {id(lp): steady_path(code, bl, lp, work) for lp in found}

    def amount(lp: Loop) -> int:
        return sum(work_of(i, work) for i in paths[id(lp)])

    carrying = [lp for lp in found if paths[id(lp)] and amount(lp) > 0]
    innermost = [lp for lp in carrying if not any(lp.contains(o) for o in carrying)]
    if not innermost:
        return None
    hot = max(innermost, key=lambda lp: (amount(lp), len(paths[id(lp)])))
    path = paths[id(hot)]
    by_class: dict[str, int] = {c: 0 for c in (*CLASSES, "other")}
    for ins in path:
        by_class[ins.cls] += 1
    return LoopMix(len(path), by_class, sum(i.global_load_bytes() for i in path),
                   sum(1 for i in path if i.cls == "tensor"), path[0].addr, path[-1].addr, len(found),
                   [f"/*{i.addr:05x}*/ {i.text}" for i in path])
