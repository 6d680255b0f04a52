"""Builds FlashCore's shared libraries with CMake + Ninja while setuptools packages `flashcore`.

`pip install --no-build-isolation .` runs build_py below: CMake configures into ./build
(override with FLASHCORE_BUILD_DIR), builds libflashcore.so and libflashcore_op.so, and places
them inside the package being built, so the wheel carries them. Editable installs
(`pip install -e .`) place them in python/flashcore/ instead. CMake options pass through
environment variables: FLASHCORE_CUDA_ARCHS (e.g. "90a"), FLASHCORE_HEAD_DIMS, FLASHCORE_DTYPES.
"""
import os
import subprocess
import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildWithCMake(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            package_dir = ROOT / "python" / "flashcore"
        else:
            package_dir = Path(self.build_lib).resolve() / "flashcore"
        build_dir = Path(os.environ.get("FLASHCORE_BUILD_DIR", ROOT / "build")).resolve()
        configure = [
            "cmake", "-S", str(ROOT), "-B", str(build_dir), "-G", "Ninja",
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DPython3_EXECUTABLE={sys.executable}",
            f"-DFLASHCORE_PACKAGE_DIR={package_dir}",
        ]
        for option in ("FLASHCORE_CUDA_ARCHS", "FLASHCORE_HEAD_DIMS", "FLASHCORE_DTYPES"):
            if os.environ.get(option):
                configure.append(f"-D{option}={os.environ[option]}")
        subprocess.run(configure, check=True)
        subprocess.run(["cmake", "--build", str(build_dir)], check=True)


class BinaryDistribution(Distribution):
    """The wheel holds compiled libraries: tag it for this platform, not as pure Python."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithCMake}, distclass=BinaryDistribution)
