#!/usr/bin/env python3
"""Whether two source trees compile kernel files to the same machine code, function by function.

Needs only nvcc: no GPU, and neither cuobjdump nor nvdisasm (which ci/sass_schedule.py needs for
its listings, and which a machine with nvcc alone may lack). Each file is compiled to a cubin
with the project's flags (ci/sass_schedule.py's compile_cu), in this tree and in another (a git
revision's c_src/ and kernels/, or a directory), and the bytes of every function's
`.text.<mangled name>` section are compared between the two cubins (ELF files, read here with
the struct module). Equal bytes are equal SASS, control codes included: what "machine code
unchanged" means in the experiment notes and commit messages.

  python3 tools/code_identity.py kernels/bwd_sm90_hdim64_fp16.cu                 # vs HEAD
  python3 tools/code_identity.py kernels/fwd_sm80_hdim128_bf16.cu --against 60a8266
  python3 tools/code_identity.py kernels/fwd_sm90_hdim*.cu --against /tmp/other-tree

Files named *sm90* are compiled for sm_90a, the others for sm_89 and sm_90a (the sm80-class and
decode kernels are built for both); --arch overrides. Prints one line per (file, arch): how many
functions are identical, which differ, which exist in one tree only. Exit status 0 when every
function is identical, 1 otherwise.

--kept: whether every function of the other tree survives byte for byte in this one under any
name (a template argument added to a kernel renames it; new variants may be added): each of the
other tree's functions is matched to one of this tree's with the same bytes. Exit status 0 when
all are found.
"""
import argparse
import concurrent.futures
import os
import shutil
import struct
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "ci"))
from sass_schedule import compile_cu, tree_at  # noqa: E402  (the project's flags; a revision's sources)


def text_sections(cubin_path):
    """{section name: bytes} of an ELF64 file's .text.* sections."""
    with open(cubin_path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        sys.exit(f"code_identity: {cubin_path} is not an ELF64 file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)

    def header(i):  # (name offset, file offset, size) of section i
        base = shoff + i * shentsize
        name, = struct.unpack_from("<I", data, base)
        offset, size = struct.unpack_from("<QQ", data, base + 0x18)
        return name, offset, size

    _, names_at, _ = header(shstrndx)
    sections = {}
    for i in range(shnum):
        name_off, offset, size = header(i)
        end = data.index(b"\0", names_at + name_off)
        name = data[names_at + name_off:end].decode()
        if name.startswith(".text."):
            sections[name[len(".text."):]] = data[offset:offset + size]
    return sections


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="kernel files, relative to the repository root")
    ap.add_argument("--against", default="HEAD", help="a git revision or a directory (default: HEAD)")
    ap.add_argument("--arch", help="comma-separated, e.g. 89,90a (default: by file name)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--kept", action="store_true",
                    help="match the other tree's functions to this tree's by their bytes, not their names")
    args = ap.parse_args()
    files = [os.path.relpath(os.path.abspath(f), ROOT) for f in args.files]
    workdir = tempfile.mkdtemp(prefix="code_identity_")
    try:
        against = os.path.abspath(args.against) if os.path.isdir(args.against) else tree_at(args.against, workdir)
        jobs = []
        for source in files:
            archs = args.arch.split(",") if args.arch else (["90a"] if "sm90" in source else ["89", "90a"])
            jobs += [(source, arch) for arch in archs]
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            built = {(s, a, tag): pool.submit(compile_cu, s, workdir, tree, tag, a)
                     for s, a in jobs for tag, tree in (("this", ROOT), ("other", against))}
            all_same = True
            for source, arch in jobs:
                mine = text_sections(built[(source, arch, "this")].result())
                theirs = text_sections(built[(source, arch, "other")].result())
                if args.kept:
                    pool_of_mine = list(mine.values())
                    lost = []
                    for name, code in theirs.items():
                        if code in pool_of_mine:
                            pool_of_mine.remove(code)
                        else:
                            lost.append(name)
                    all_same &= not lost
                    print(f"{source} sm_{arch}: {'kept' if not lost else 'CHANGED'}: {len(theirs) - len(lost)} of "
                          f"{len(theirs)} functions of {args.against} found byte for byte among {len(mine)}")
                    for name in lost:
                        print(f"  not found: {name}")
                    continue
                same = [n for n in mine if n in theirs and mine[n] == theirs[n]]
                differ = [n for n in mine if n in theirs and mine[n] != theirs[n]]
                only = sorted(set(mine) ^ set(theirs))
                all_same &= not differ and not only
                verdict = "identical" if not differ and not only else "DIFFERENT"
                print(f"{source} sm_{arch}: {verdict}: {len(same)} of {len(set(mine) | set(theirs))} functions identical")
                for name in differ:
                    print(f"  differs: {name} ({len(theirs[name])} -> {len(mine[name])} bytes)")
                for name in only:
                    print(f"  only in {'this tree' if name in mine else args.against}: {name}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    sys.exit(0 if all_same else 1)


if __name__ == "__main__":
    main()
