"""Checks a FlashCore wheel with kernels and gives it its manylinux tag (used by ci/build_wheel.sh).

    python ci/check_wheel.py WHEEL OUTDIR

What it checks (the auditwheel-style rules that apply to this wheel), printing what it finds:
  * contents: the Python package, libflashcore.so and libflashcore_op.so, the build record;
  * the tag: py3-none-<platform>, not tied to a CPython version (nothing in the wheel is a
    Python extension: the op library is loaded with torch.ops.load_library and is on PyTorch's
    stable ABI), and Root-Is-Purelib false;
  * each .so's NEEDED libraries (readelf -d): only the wheel's own libflashcore.so, PyTorch's
    (libtorch*, libc10*: the torch the user installed provides them), CUDA's runtime and driver,
    and the system libraries every manylinux platform has (glibc's, libstdc++, libgcc_s);
  * RUNPATH/RPATH: nothing but $ORIGIN (no path of the build machine);
  * symbol versions (readelf --dyn-syms): the newest GLIBC_x.y any .so needs sets the
    manylinux_2_y tag (never below 2_28, PyTorch's own wheels' floor), and GLIBCXX / CXXABI
    must stay within what manylinux_2_28's libstdc++ (GCC 8) has.
Then it writes the wheel, retagged py3-none-manylinux_2_<y>_x86_64 (WHEEL's Tag and RECORD
updated), into OUTDIR and prints its path last. Exits non-zero on any failed check.
"""
import base64
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile

# Libraries a .so in the wheel may need. Anything else would have to be bundled.
ALLOWED_NEEDED = [
    r"libflashcore\.so",                      # the wheel's own C library (found via $ORIGIN)
    r"libtorch(_cpu|_cuda)?\.so", r"libc10(_cuda)?\.so",   # the installed PyTorch's
    r"libcudart\.so\.\d+", r"libcuda\.so\.1",   # CUDA runtime (linked statically now) / driver
    r"libc\.so\.6", r"libm\.so\.6", r"libdl\.so\.2", r"libpthread\.so\.0", r"librt\.so\.1",
    r"ld-linux-x86-64\.so\.2", r"libstdc\+\+\.so\.6", r"libgcc_s\.so\.1",
]
# manylinux_2_28's libstdc++ (GCC 8): the newest symbol versions a wheel may need from it.
MAX_GLIBCXX = (3, 4, 25)
MAX_CXXABI = (1, 3, 11)
MIN_GLIBC_MINOR = 28
EXPECTED_FILES = ["flashcore/__init__.py", "flashcore/_ops.py", "flashcore/_fallback.py",
                  "flashcore/_build_config.py", "flashcore/libflashcore.so",
                  "flashcore/libflashcore_op.so", "flashcore/integrations/hf.py"]


def readelf(*args):
    return subprocess.run(["readelf", "-W", *args], check=True, capture_output=True,
                          text=True).stdout


def version_tuple(text):
    return tuple(int(x) for x in text.split("."))


def check_so(path, name, problems):
    """Prints and checks one library; returns the newest GLIBC minor version it needs."""
    dynamic = readelf("-d", path)
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic)
    paths = re.findall(r"\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[([^\]]+)\]", dynamic)
    print(f"  {name}: NEEDED {', '.join(needed)}; RUNPATH {paths or 'none'}")
    for lib in needed:
        if not any(re.fullmatch(pattern, lib) for pattern in ALLOWED_NEEDED):
            problems.append(f"{name} needs {lib}, which is neither the wheel's, PyTorch's, "
                            "CUDA's nor a manylinux system library")
    for entry in paths:
        for part in entry.split(":"):
            if part != "$ORIGIN":
                problems.append(f"{name} has a run path of the build machine: {part}")
    symbols = readelf("--dyn-syms", path)
    versions = {}
    for prefix, version in re.findall(r"@+(GLIBC|GLIBCXX|CXXABI)_([0-9.]+)", symbols):
        versions.setdefault(prefix, set()).add(version_tuple(version))
    newest = {prefix: max(v) for prefix, v in versions.items()}
    print("    newest symbol versions: " + ", ".join(
        f"{p}_{'.'.join(map(str, v))}" for p, v in sorted(newest.items())))
    if newest.get("GLIBCXX", (0,)) > MAX_GLIBCXX:
        problems.append(f"{name} needs GLIBCXX_{'.'.join(map(str, newest['GLIBCXX']))}, newer "
                        "than manylinux_2_28's libstdc++ has")
    if newest.get("CXXABI", (0,)) > MAX_CXXABI:
        problems.append(f"{name} needs CXXABI_{'.'.join(map(str, newest['CXXABI']))}, newer "
                        "than manylinux_2_28's libstdc++ has")
    glibc = newest.get("GLIBC", (2, 0))
    return glibc[1] if glibc[0] == 2 else 99


def record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def retag(wheel, outdir, platform):
    """A copy of the wheel tagged py3-none-<platform>: WHEEL's Tag line, RECORD's line for
    WHEEL, and the file name change; every other entry is copied as it is."""
    base = os.path.basename(wheel)
    dist, version = base.split("-")[:2]
    new_name = f"{dist}-{version}-py3-none-{platform}.whl"
    info = f"{dist}-{version}.dist-info"
    with zipfile.ZipFile(wheel) as src:
        wheel_meta = src.read(f"{info}/WHEEL").decode()
        wheel_meta = re.sub(r"(?m)^Tag: .*$", f"Tag: py3-none-{platform}", wheel_meta).encode()
        record = src.read(f"{info}/RECORD").decode().splitlines()
        record = [record_line(f"{info}/WHEEL", wheel_meta) if line.startswith(f"{info}/WHEEL,")
                  else line for line in record]
        os.makedirs(outdir, exist_ok=True)
        target = os.path.join(outdir, new_name)
        with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as dst:
            for item in src.infolist():
                if item.filename == f"{info}/WHEEL":
                    dst.writestr(item, wheel_meta)
                elif item.filename == f"{info}/RECORD":
                    dst.writestr(item, "\n".join(record) + "\n")
                else:
                    dst.writestr(item, src.read(item.filename))
    return target


def main(wheel, outdir):
    problems = []
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        print(f"{os.path.basename(wheel)}: {len(names)} files")
        for item in whl.infolist():
            print(f"  {item.file_size:>12,}  {item.filename}")
        for name in EXPECTED_FILES:
            if name not in names:
                problems.append(f"missing {name}")
        info = [n for n in names if n.endswith(".dist-info/WHEEL")]
        wheel_meta = whl.read(info[0]).decode() if info else ""
        if "Root-Is-Purelib: false" not in wheel_meta:
            problems.append("WHEEL does not say Root-Is-Purelib: false")
        tags = re.findall(r"(?m)^Tag: (.*)$", wheel_meta)
        if not tags or any(not t.startswith("py3-none-") for t in tags):
            problems.append(f"tag {tags}: expected py3-none-<platform>")
        config = whl.read("flashcore/_build_config.py").decode() if \
            "flashcore/_build_config.py" in names else ""
        print("build record:\n  " + "\n  ".join(config.strip().splitlines()[1:]))
        with tempfile.TemporaryDirectory() as tmp:
            glibc_minor = MIN_GLIBC_MINOR
            print("libraries:")
            for name in names:
                if name.endswith(".so"):
                    path = whl.extract(name, tmp)
                    glibc_minor = max(glibc_minor, check_so(path, name, problems))
    platform = f"manylinux_2_{glibc_minor}_x86_64"
    if glibc_minor > MIN_GLIBC_MINOR:
        print(f"note: the libraries need glibc 2.{glibc_minor} (this build machine's); built in a "
              f"manylinux_2_{MIN_GLIBC_MINOR} image with CUDA 13 they would get PyTorch's own tag")
    if problems:
        for p in problems:
            print(f"FAIL: {p}", file=sys.stderr)
        return 1
    target = retag(wheel, outdir, platform)
    print(f"ok: tagged py3-none-{platform}")
    print(target)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
