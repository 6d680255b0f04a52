"""The C library's install (CPU): `cmake --install build --prefix P` puts libflashcore.so,
flashcore.h, a CMake package and a pkg-config file under P, and a C program outside the tree
builds against the package (find_package(flashcore) -> flashcore::flashcore) and runs: it
validates an empty fc_params and must get FC_UNSUPPORTED_EMPTY's message back.

Needs the CMake build directory ./build (ci/install.sh or `cmake -S . -B build` makes it) and
cmake with ninja; skips, saying why, without them.
"""
import os
import pathlib
import shutil
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
BUILD = pathlib.Path(os.environ.get("FLASHCORE_BUILD_DIR", REPO / "build"))

CONSUMER_C = r"""
#include <flashcore.h>
#include <stdio.h>
int main(void) {
    fc_params p;
    fc_params_init(&p);
    const fc_status s = fc_params_validate(&p);
    printf("%d %s\n", (int)s, fc_status_string(s));
    return s == FC_UNSUPPORTED_EMPTY ? 0 : 1;
}
"""

CONSUMER_CMAKE = """
cmake_minimum_required(VERSION 3.24)
project(consumer LANGUAGES C)
find_package(flashcore 0.1 REQUIRED)
add_executable(consumer main.c)
target_link_libraries(consumer PRIVATE flashcore::flashcore)
"""


def built_library():
    """Where the build put libflashcore.so (CMakeCache's FLASHCORE_PACKAGE_DIR), or None."""
    cache = BUILD / "CMakeCache.txt"
    if not cache.exists():
        return None
    for line in cache.read_text().splitlines():
        if line.startswith("FLASHCORE_PACKAGE_DIR:"):
            lib = pathlib.Path(line.split("=", 1)[1]) / "libflashcore.so"
            return lib if lib.exists() else None
    return None


def run(cmd, **kw):
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)
    assert res.returncode == 0, f"{' '.join(map(str, cmd))}\n{res.stdout}\n{res.stderr}"
    return res


@pytest.mark.skipif(built_library() is None, reason=f"no built libflashcore.so from a CMake build in {BUILD}")
@pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("ninja") is None,
                    reason="cmake and ninja are needed")
def test_install_and_build_a_consumer(tmp_path):
    prefix = tmp_path / "prefix"
    run(["cmake", "--install", str(BUILD), "--prefix", str(prefix)])
    lib = prefix / "lib"
    for path in (lib / "libflashcore.so", prefix / "include" / "flashcore.h",
                 lib / "cmake" / "flashcore" / "flashcoreConfig.cmake",
                 lib / "pkgconfig" / "flashcore.pc"):
        assert path.exists(), f"not installed: {path}"
    pc = (lib / "pkgconfig" / "flashcore.pc").read_text()
    assert "-lflashcore" in pc and "${pcfiledir}" in pc  # relocatable

    src = tmp_path / "consumer"
    src.mkdir()
    (src / "main.c").write_text(CONSUMER_C)
    (src / "CMakeLists.txt").write_text(CONSUMER_CMAKE)
    run(["cmake", "-S", str(src), "-B", str(src / "b"), "-G", "Ninja", f"-DCMAKE_PREFIX_PATH={prefix}"])
    run(["cmake", "--build", str(src / "b")])
    out = run([str(src / "b" / "consumer")], env={**os.environ, "LD_LIBRARY_PATH": str(lib)})
    assert "a size is zero" in out.stdout, out.stdout
