"""Builds FlashCore's shared libraries with CMake + Ninja while setuptools packages `flashcore`.

`pip install --no-build-isolation .` runs build_py below: CMake configures into ./build
(override with FLASHCORE_BUILD_DIR), builds libflashcore.so and libflashcore_op.so, and places
them inside the package being built, so the wheel carries them. Editable installs
(`pip install -e .`) place them in python/flashcore/ instead. CMake options pass through
environment variables: FLASHCORE_CUDA_ARCHS (e.g. "90a"), FLASHCORE_HEAD_DIMS, FLASHCORE_DTYPES,
FLASHCORE_BUILD_TESTS (OFF: no C tests).

Without a CUDA compiler (no nvcc on PATH and CUDACXX unset) the build skips CMake, says so in
one line, and packages the Python code alone: a py3-none-any wheel whose `import flashcore`
works and runs every call through PyTorch's SDPA (flashcore/_fallback.py). pip shows that line
with `pip install -v .`; `flashcore.FALLBACK_ONLY` says it afterwards. FLASHCORE_REQUIRE_CUDA=1
turns a missing nvcc into an error, reported in one line before anything is built.

With the kernels, the wheel is tagged py3-none-<platform>: nothing in it is a Python extension
(the op library is loaded with torch.ops.load_library and uses PyTorch's stable ABI), so one
wheel serves every CPython version. ci/build_wheel.sh builds and checks the prebuilt wheel.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

try:  # setuptools >= 70.1 has bdist_wheel; older ones take it from the wheel package
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:  # no wheel builder here: nothing to tag (pip says what is missing)
        bdist_wheel = None

ROOT = Path(__file__).resolve().parent


def find_nvcc():
    """The CUDA compiler CMake would pick up: $CUDACXX, else nvcc on PATH; None without one."""
    cudacxx = os.environ.get("CUDACXX")
    if cudacxx:
        return shutil.which(cudacxx)
    return shutil.which("nvcc")


NVCC = find_nvcc()
# Checked here, when pip first runs this file (before it builds anything).
if os.environ.get("FLASHCORE_REQUIRE_CUDA") == "1" and NVCC is None:
    sys.exit("flashcore: FLASHCORE_REQUIRE_CUDA=1 but no CUDA compiler was found (nvcc not on "
             "PATH, CUDACXX unset): add CUDA 13's bin/ to PATH, or unset FLASHCORE_REQUIRE_CUDA "
             "to install without kernels")


class BuildWithCMake(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            package_dir = ROOT / "python" / "flashcore"
        else:
            package_dir = Path(self.build_lib).resolve() / "flashcore"
        if NVCC is None:
            self.skip_cuda(package_dir)
            return
        build_dir = Path(os.environ.get("FLASHCORE_BUILD_DIR", ROOT / "build")).resolve()
        configure = [
            "cmake", "-S", str(ROOT), "-B", str(build_dir), "-G", "Ninja",
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DPython3_EXECUTABLE={sys.executable}",
            f"-DFLASHCORE_PACKAGE_DIR={package_dir}",
        ]
        for option in ("FLASHCORE_CUDA_ARCHS", "FLASHCORE_HEAD_DIMS", "FLASHCORE_DTYPES",
                       "FLASHCORE_BUILD_TESTS"):
            if os.environ.get(option):
                configure.append(f"-D{option}={os.environ[option]}")
        subprocess.run(configure, check=True)
        subprocess.run(["cmake", "--build", str(build_dir)], check=True)

    def skip_cuda(self, package_dir):
        print("flashcore: nvcc not found (not on PATH, CUDACXX unset): installing without CUDA "
              "kernels, every call runs PyTorch's SDPA (add CUDA 13's nvcc to PATH for the "
              "kernels; FLASHCORE_REQUIRE_CUDA=1 makes this an error)", file=sys.stderr, flush=True)
        if getattr(self, "editable_mode", False):
            return  # python/flashcore/ is the working tree: leave an earlier CMake build there
        # setuptools reuses build/lib between builds: drop libraries and the build record an
        # earlier build with CUDA left there (and the working tree's record that build_py
        # copied), so this package cannot claim kernels it does not have.
        for stale in package_dir.glob("libflashcore*.so"):
            stale.unlink()
        (package_dir / "_build_config.py").write_text(
            "# Written by setup.py: built without a CUDA compiler, so no kernels.\n"
            "HEAD_DIMS = ()\nDTYPES = ()\nCUDA_ARCHS = ()\n")


class BinaryDistribution(Distribution):
    """With the kernels, the wheel holds compiled libraries: a platform wheel. Without them it
    is pure Python (py3-none-any)."""

    def has_ext_modules(self):
        return NVCC is not None


class PlatformWheel(bdist_wheel or object):
    """Tags a wheel with kernels py3-none-<platform> instead of cpXY-cpXY-<platform>: its
    libraries are loaded by torch.ops.load_library, never imported by CPython, so any Python 3
    that runs the torch it needs can use it. The platform comes from --plat-name (default: this
    machine's, e.g. linux_x86_64)."""

    def get_tag(self):
        python, abi, platform = super().get_tag()
        if platform == "any":
            return python, abi, platform
        return "py3", "none", platform


COMMANDS = {"build_py": BuildWithCMake}
if bdist_wheel is not None:
    COMMANDS["bdist_wheel"] = PlatformWheel
setup(cmdclass=COMMANDS, distclass=BinaryDistribution)
