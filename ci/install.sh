#!/usr/bin/env bash
# Installs what FlashCore needs to build and test, then builds and installs it:
#   torch (2.14.1 unless a torch is already importable), cmake, ninja, pytest, transformers 5.18
#   (unless one is already importable), and the package
#   itself with `pip install --no-build-isolation .` (which runs CMake into ./build).
# Needs nvcc (CUDA 13) on PATH. Usage: bash ci/install.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "== installing torch 2.14.1"
  "$PY" -m pip install -q torch==2.14.1
fi
if ! command -v nvcc > /dev/null 2>&1; then
  echo "ci/install.sh: nvcc not found on PATH: building FlashCore needs the CUDA 13 toolkit's nvcc (add its bin/ to PATH)" >&2
  exit 1
fi
echo "== installing build and test tools"
"$PY" -m pip install -q "cmake>=3.24" ninja pytest
# transformers (for the integration tests): only where none is installed, so a user's own stays.
if ! "$PY" -c "import transformers" 2>/dev/null; then
  "$PY" -m pip install -q transformers==5.18.0
fi
echo "== building and installing flashcore (CMake + Ninja into ./build)"
# The full log (with ptxas' register report) goes to build/pip-install.log; progress is shown.
mkdir -p build
if ! "$PY" -m pip install --no-build-isolation --no-deps -v . > build/pip-install.log 2>&1; then
  tail -n 60 build/pip-install.log
  echo "install failed; full log: build/pip-install.log" >&2
  exit 1
fi
grep -E "^ *\[[0-9]+/[0-9]+\]|Successfully installed" build/pip-install.log || true
"$PY" -c "import flashcore, torch; print('flashcore', flashcore.__version__, 'on torch', torch.__version__)"
