#!/usr/bin/env python3
"""Static schedule of a kernel's main loop, read from the SASS control codes (no GPU needed).

Every Volta-and-later SASS instruction carries, in its control bits, the number of cycles the
warp waits before issuing its next instruction ("stall", 1 = the next cycle). The compiler
sets it for fixed-latency dependencies and pipe throughputs (an FADD whose result the next
instruction reads, back-to-back MUFU), and Nsight Compute reports those cycles as the "wait"
stall reason. Summed over a loop body they are the fewest cycles one warp takes per iteration
before any dynamic stall (barriers, memory, tensor-core queue), so two builds of a kernel can
be compared on a CPU-only machine. What it cannot say: whether those cycles are on the
critical path (in the Hopper family a consumer warpgroup's softmax overlaps the other's GEMMs).

For each loop (a backward branch) that holds tensor-core instructions (HGMMA, HMMA), it prints
the loop's instructions, static cycles, the opcodes that take most of them, and its basic
blocks, so that rarely taken blocks (masking, the exact-exponent path) can be told apart.

  python3 ci/sass_schedule.py kernels/fwd_sm90_hdim128_fp16.cu --kernel 'Lb0'   # compiles
  python3 ci/sass_schedule.py build.cubin --kernel fwd_kernel --blocks
  python3 ci/sass_schedule.py a.cubin --compare b.cubin --kernel 'Lb0'         # A/B totals
  python3 ci/sass_schedule.py kernels/fwd_sm90_hdim64_fp16.cu --against main    # this tree vs main

Needs nvcc (for a .cu) and cuobjdump (CUDA toolkit; or $CUOBJDUMP). Control-bit layout: bits
41-44 of each instruction's upper 64-bit word (Volta to Hopper).
"""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TENSOR_OPS = ("HGMMA", "HMMA")
INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;\s*/\* (0x[0-9a-f]+) \*/")
UPPER = re.compile(r"^\s*/\* (0x[0-9a-f]+) \*/")
FUNC = re.compile(r"Function : (\S+)")
BRANCH_TARGET = re.compile(r"\bBRA\b.*?(0x[0-9a-f]+)")


def find_tool(name, env):
    """$env, PATH, the CUDA toolkit, then (cuobjdump) the copy Triton ships beside PyTorch."""
    candidates = [os.environ.get(env), shutil.which(name)]
    candidates += [os.path.join(home, "bin", name) for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda") if home]
    try:
        import triton  # a pip-installed CUDA toolkit may lack cuobjdump; Triton's wheel has one
        candidates.append(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name))
    except ImportError:
        pass
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    sys.exit(f"sass_schedule: {name} not found (set {env} or put the CUDA toolkit's bin on PATH)")


def compile_cu(source, workdir, root=ROOT, tag="this", arch=None):
    """One kernel file (path relative to `root` or absolute) to a cubin with the project's flags,
    for `arch` (default: 90a for sm90 files, else $SASS_ARCH or 89)."""
    if arch is None:
        arch = "90a" if "sm90" in os.path.basename(source) else os.environ.get("SASS_ARCH", "89")
    source = source if os.path.isabs(source) else os.path.join(root, source)
    cubin = os.path.join(workdir, f"{tag}_{arch}_{os.path.basename(source)}.cubin")
    cmd = [find_tool("nvcc", "NVCC"), "-I", os.path.join(root, "c_src"), "-I", os.path.join(root, "kernels"),
           "-O3", "--use_fast_math", "--expt-relaxed-constexpr", "-std=c++17",
           f"-gencode=arch=compute_{arch},code=sm_{arch}", "-cubin", "-o", cubin, source]
    subprocess.run(cmd, check=True)
    return cubin


def instructions(binary, kernel_pattern):
    """{function: [(address, text, stall)]} for functions whose mangled name matches."""
    listing = subprocess.run([find_tool("cuobjdump", "CUOBJDUMP"), "-sass", binary], check=True,
                             stdout=subprocess.PIPE, text=True).stdout
    return parse_listing(listing, kernel_pattern)


def parse_listing(listing, kernel_pattern):
    """cuobjdump -sass text -> {function: [(address, text, stall)]}; each instruction line is
    followed by the line with its upper 64 bits, whose bits 41-44 are the stall count."""
    text = listing.splitlines()
    pattern = re.compile(kernel_pattern)
    functions, current = {}, None
    for i, line in enumerate(text):
        m = FUNC.search(line)
        if m:
            current = m.group(1) if pattern.search(m.group(1)) else None
            if current:
                functions[current] = []
            continue
        m = INSTR.match(line)
        if m and current and i + 1 < len(text):
            upper = UPPER.match(text[i + 1])
            stall = (int(upper.group(1), 16) >> 41) & 0xF if upper else 1
            functions[current].append((int(m.group(1), 16), m.group(2), stall))
    return functions


def opcode(text):
    words = text.split()
    word = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return word.split(".")[0]


def tensor_loops(body):
    """(start, end) of every loop closed by a backward branch that holds a tensor-core op."""
    loops = []
    for address, text, _ in body:
        m = BRANCH_TARGET.search(text)
        # A loop's back edge is conditional; an unconditional backward branch is the way back
        # from an out-of-line stub (a barrier's retry loop placed after the kernel's code).
        if m and int(m.group(1), 16) <= address and text.startswith("@"):
            start = int(m.group(1), 16)
            if any(start <= a <= address and opcode(t) in TENSOR_OPS for a, t, _ in body):
                loops.append((start, address))
    return sorted(set(loops), key=lambda r: r[1] - r[0])


def summary(instrs):
    cycles = sum(s for _, _, s in instrs)
    by_op, count = collections.Counter(), collections.Counter()
    for _, text, stall in instrs:
        by_op[opcode(text)] += stall
        count[opcode(text)] += 1
    return cycles, by_op, count


def blocks(instrs):
    """Basic blocks: a block ends at a branch or before a branch target."""
    targets = {int(m.group(1), 16) for _, t, _ in instrs for m in [BRANCH_TARGET.search(t)] if m}
    out, cur = [], []
    for ins in instrs:
        if cur and ins[0] in targets:
            out.append(cur)
            cur = []
        cur.append(ins)
        if opcode(ins[1]) in ("BRA", "EXIT", "RET"):
            out.append(cur)
            cur = []
    if cur:
        out.append(cur)
    return out


def _cheapest(bl, src, dst):
    """Fewest (instructions, static cycles) from the start of block src to the end of block dst,
    going forward: a branch to a later block of the loop, or falling through. (A branch out of
    the loop, such as a barrier's retry, counts as not taken.)"""
    start = {b[0][0]: i for i, b in enumerate(bl)}
    inf = (float("inf"), 0)
    best = [inf] * len(bl)
    best[src] = (0, 0)
    for i in range(src, dst + 1):
        if best[i] == inf:
            continue
        b = bl[i]
        here = (best[i][0] + len(b), best[i][1] + sum(x[2] for x in b))
        if i == dst:
            return here
        last = b[-1][1]
        m = BRANCH_TARGET.search(last)
        if m and int(m.group(1), 16) in start and src < start[int(m.group(1), 16)] <= dst:
            j = start[int(m.group(1), 16)]
            best[j] = min(best[j], here)
        if not (m and not last.startswith("@")) and i + 1 <= dst:  # falls through
            best[i + 1] = min(best[i + 1], here)
    return None


def common_path(instrs):
    """One full, unmasked iteration: the fewest instructions round the loop through its main
    exponentiation block (the block with the most MUFU, the fewer instructions on a tie; a
    masked tile's blocks, the rare exact-exponent path and partial copies are not on it). Without
    MUFU, just the fewest instructions round the loop."""
    bl = blocks(instrs)
    mufu = [sum(opcode(t) == "MUFU" for _, t, _ in b) for b in bl]
    if max(mufu) == 0:
        return _cheapest(bl, 0, len(bl) - 1)
    through = min(range(len(bl)), key=lambda i: (-mufu[i], len(bl[i])))
    to = _cheapest(bl, 0, through)
    on = _cheapest(bl, through, len(bl) - 1) if through < len(bl) - 1 else None
    if to is None or (through < len(bl) - 1 and on is None):
        return None
    if through == len(bl) - 1:
        return to
    b = bl[through]
    own = (len(b), sum(x[2] for x in b))  # counted in both halves
    return (to[0] + on[0] - own[0], to[1] + on[1] - own[1])


def report(name, body, show_blocks, loops_to_show):
    print(f"== {name}")
    loops = tensor_loops(body)
    if not loops:
        print("   no loop with tensor-core instructions")
        return []
    totals = []
    for start, end in loops[:loops_to_show]:
        instrs = [x for x in body if start <= x[0] <= end]
        cycles, by_op, count = summary(instrs)
        tensor = sum(count[o] for o in TENSOR_OPS)
        path = common_path(instrs)
        totals.append(path)
        print(f"   loop {start:#07x}-{end:#07x}: {len(instrs)} instructions ({tensor} tensor), "
              f"{cycles} static cycles, {cycles - len(instrs)} of them waits")
        if path:
            print(f"     common path (a full tile, through the main MUFU block): {path[0]} instructions, "
                  f"{path[1]} static cycles")
        top = ", ".join(f"{op} {by_op[op]} ({count[op]})" for op, _ in by_op.most_common(10))
        print(f"     cycles by opcode (instructions): {top}")
        if show_blocks:
            for block in blocks(instrs):
                c, ops, _ = summary(block)
                main_ops = ",".join(op for op, _ in ops.most_common(3))
                print(f"       {block[0][0]:#07x} {len(block):4d} instr {c:5d} cycles  [{main_ops}]  "
                      f"ends: {block[-1][1][:60]}")
    return totals


def tree_at(rev, workdir):
    """The kernel sources (c_src/, kernels/) of git revision `rev`, unpacked under workdir."""
    tree = os.path.join(workdir, "against")
    os.makedirs(tree)
    archive = subprocess.run(["git", "-C", ROOT, "archive", rev, "c_src", "kernels"],
                             check=True, stdout=subprocess.PIPE).stdout
    subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
    return tree


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary", help="a .cubin / .so, or a kernels/*.cu file to compile")
    ap.add_argument("--compare", help="a second binary or .cu: print both loops' totals side by side")
    ap.add_argument("--against", metavar="REV", help="compare with the same .cu built from git revision REV")
    ap.add_argument("--kernel", default="fwd_kernel", help="regex on the mangled kernel name")
    ap.add_argument("--blocks", action="store_true", help="list each loop's basic blocks")
    ap.add_argument("--loops", type=int, default=1, help="how many loops per kernel, innermost first")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        builds = [(args.binary, ROOT, "this")]
        if args.against:
            if not args.binary.endswith(".cu"):
                sys.exit("sass_schedule: --against needs a .cu file")
            tree = tree_at(args.against, tmp)
            source = os.path.relpath(os.path.abspath(args.binary), ROOT)
            builds = [(source, tree, args.against), (source, ROOT, "this tree")]
        elif args.compare:
            builds.append((args.compare, ROOT, "that"))
        results = []
        for binary, root, tag in builds:
            path = compile_cu(binary, tmp, root, tag.replace(" ", "_")) if binary.endswith(".cu") else binary
            print(f"# {binary} ({tag})")
            per_kernel = {}
            for name, body in instructions(path, args.kernel).items():
                per_kernel[name] = report(name, body, args.blocks, args.loops)
            results.append(per_kernel)
        if len(results) == 2:
            print("# common path of the innermost tensor loop, A -> B: instructions, static cycles")
            for name in results[0]:
                a, b = results[0][name], results[1].get(name)
                if a and b and a[0] and b[0]:
                    (ai, ac), (bi, bc) = a[0], b[0]
                    print(f"   {name}: {ai} -> {bi} ({100.0 * (bi - ai) / ai:+.1f}%), "
                          f"{ac} -> {bc} ({100.0 * (bc - ac) / ac:+.1f}%)")


if __name__ == "__main__":
    main()
