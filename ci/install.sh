#!/usr/bin/env bash
# Installs what FlashCore needs to build and test, then builds and installs it:
#   torch (2.14.1 unless a torch is already importable), cmake and ninja (only to build the
#   kernels), the package itself with `pip install --no-build-isolation .` (which runs CMake
#   into ./build), then what the tests need: the `test` extra of pyproject.toml (pytest,
#   transformers), each only where that package is not installed at all, so the user's own
#   versions stay (ci/missing_requirements.py), at the version CI tests (ci/tested_versions.txt).
#
# With nvcc (CUDA 13) on PATH the package is built with its kernels. Without it, the script
# says so in one line and installs the package without kernels (setup.py skips CMake; every
# call falls back to PyTorch's SDPA): a CPU-only machine can still import FlashCore and run
# the code that calls it. FLASHCORE_REQUIRE_CUDA=1 makes a missing nvcc an error instead.
# FLASHCORE_WHEEL=path/to/flashcore-*.whl installs that prebuilt wheel (ci/build_wheel.sh)
# instead of building: no compiler needed, seconds.
# Usage: bash ci/install.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "== installing torch 2.14.1"
  "$PY" -m pip install -q torch==2.14.1
fi
KERNELS=1
if [ -n "${FLASHCORE_WHEEL:-}" ]; then
  KERNELS=wheel
elif ! command -v nvcc > /dev/null 2>&1 && [ -z "${CUDACXX:-}" ]; then
  if [ "${FLASHCORE_REQUIRE_CUDA:-}" = 1 ]; then
    echo "ci/install.sh: FLASHCORE_REQUIRE_CUDA=1 but nvcc is not on PATH: add the CUDA 13 toolkit's bin/ to PATH" >&2
    exit 1
  fi
  echo "ci/install.sh: nvcc not found on PATH, so FlashCore installs without its CUDA kernels (every call falls back to PyTorch's SDPA); for the kernels add the CUDA 13 toolkit's bin/ to PATH and rerun (FLASHCORE_REQUIRE_CUDA=1 makes this an error)"
  KERNELS=0
fi
echo "== installing build tools"
# The build runs without isolation (it compiles against the torch installed here), so the
# build backend must be in this environment: setuptools with bdist_wheel (>= 70.1; a fresh
# venv's bundled setuptools is older). A newer one already installed is left alone.
if [ "$KERNELS" != wheel ] && ! "$PY" -c "import setuptools.command.bdist_wheel" 2>/dev/null; then
  "$PY" -m pip install -q "setuptools>=70.1"
fi
if [ "$KERNELS" = 1 ]; then
  "$PY" -m pip install -q "cmake>=3.24" ninja
fi
TARGET=(.)
if [ "$KERNELS" = wheel ]; then
  echo "== installing the prebuilt wheel $FLASHCORE_WHEEL"
  # Reinstalled even where the same version is installed: that may be a different build.
  TARGET=(--force-reinstall "$FLASHCORE_WHEEL")
elif [ "$KERNELS" = 1 ]; then
  echo "== building and installing flashcore (CMake + Ninja into ./build)"
else
  echo "== installing flashcore without kernels (no CMake build)"
fi
# The full log (with ptxas' register report) goes to build/pip-install.log; progress is shown.
mkdir -p build
if ! "$PY" -m pip install --no-build-isolation --no-deps -v "${TARGET[@]}" > build/pip-install.log 2>&1; then
  tail -n 60 build/pip-install.log
  echo "install failed; full log: build/pip-install.log" >&2
  exit 1
fi
grep -E "^ *\[[0-9]+/[0-9]+\]|Successfully installed" build/pip-install.log || true
mapfile -t MISSING < <("$PY" ci/missing_requirements.py test)
if [ -n "${MISSING[*]}" ]; then
  echo "== installing what the tests need: ${MISSING[*]}"
  "$PY" -m pip install -q -c ci/tested_versions.txt "${MISSING[@]}"
fi
"$PY" -c "import flashcore, torch; print('flashcore', flashcore.__version__, 'on torch', torch.__version__)
if flashcore.FALLBACK_ONLY: print('flashcore: calls fall back to PyTorch:', flashcore.FALLBACK_ONLY)"
