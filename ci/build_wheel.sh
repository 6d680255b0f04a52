#!/usr/bin/env bash
# Builds FlashCore's prebuilt wheel (kernels for sm_89 and sm_90a), checks it, and installs it
# once in a fresh virtual environment without nvcc to see that it imports and loads.
#
#   bash ci/build_wheel.sh            # -> dist/flashcore-<version>-py3-none-manylinux_2_<y>_x86_64.whl
#
# One wheel per CUDA major (this one: the CUDA 13 nvcc on PATH), for every CPython 3 and every
# torch >= 2.11 built for that CUDA: nothing in it is a Python extension (tagged py3-none), the
# op library is on PyTorch's stable ABI and loaded with torch.ops.load_library, and CUDA's
# runtime is linked statically. ci/check_wheel.py lists it, checks each .so's needed libraries
# and run paths with readelf, and sets the manylinux tag from the newest glibc symbol the
# libraries need (built on this Debian 12 machine: 2_34; built in a manylinux_2_28 image with
# CUDA 13 it would be 2_28, PyTorch's own floor).
#
# Measured on the 2-core CPU machine (from a fresh clone): every kernel, 3 min 17 s in all
# (build 182 s), an 11.6 MB wheel; trimmed to one head dim and dtype, the plumbing check below,
# 75 s, 3.6 MB (the wheel records what it holds in _build_config.py, and calls for what it
# left out fall back to PyTorch):
#   FLASHCORE_HEAD_DIMS=64 FLASHCORE_DTYPES=fp16 bash ci/build_wheel.sh
# Environment: FLASHCORE_CUDA_ARCHS (default "89;90a"), FLASHCORE_HEAD_DIMS, FLASHCORE_DTYPES
# (default: all), WHEEL_DIR (default dist), WHEEL_INSTALL_CHECK=0 to skip the install check,
# WHEEL_REUSE_OBJECTS=1 to keep an earlier build's objects (not for a wheel you ship).
# The CMake build goes to build/wheel (FLASHCORE_BUILD_DIR), apart from ./build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! command -v nvcc > /dev/null 2>&1; then
  echo "ci/build_wheel.sh: nvcc not found on PATH: the wheel carries CUDA kernels, so building it needs the CUDA 13 toolkit's bin/ on PATH" >&2
  exit 1
fi
export FLASHCORE_CUDA_ARCHS=${FLASHCORE_CUDA_ARCHS:-89;90a}
export FLASHCORE_REQUIRE_CUDA=1   # never a wheel without kernels from this script
export FLASHCORE_BUILD_TESTS=OFF  # the C tests are not shipped
export FLASHCORE_BUILD_DIR=${FLASHCORE_BUILD_DIR:-build/wheel}
WHEEL_DIR=${WHEEL_DIR:-dist}
STAGE=build/wheel-stage
# A release artifact is built from nothing: the build folder goes (cache and objects), and
# setuptools' staging folder with it, so nothing of an earlier build is packaged. Reused objects
# once shipped a stale kernel object (its recorded header dependencies lost by an interrupted
# build, so Ninja saw it as up to date) whose launcher read an older fc_params: the wheel's
# sm90 bf16 D=256 calls crashed in host code (docs/experiments/README.md, issue 36).
# WHEEL_REUSE_OBJECTS=1 keeps the objects (only the CMake cache goes) for quick local tries.
if [ "${WHEEL_REUSE_OBJECTS:-0}" = 1 ]; then
  rm -f "$FLASHCORE_BUILD_DIR/CMakeCache.txt"
else
  rm -rf "$FLASHCORE_BUILD_DIR"
fi
rm -rf "$STAGE" build/lib*/flashcore
mkdir -p "$STAGE" "$FLASHCORE_BUILD_DIR"
echo "== building the wheel (archs ${FLASHCORE_CUDA_ARCHS}, head dims ${FLASHCORE_HEAD_DIMS:-all}, dtypes ${FLASHCORE_DTYPES:-all}); log: $STAGE/build.log"
start=$(date +%s)
if ! "$PY" -m pip wheel --no-build-isolation --no-deps -v -w "$STAGE" . > "$STAGE/build.log" 2>&1; then
  tail -n 40 "$STAGE/build.log"
  echo "ci/build_wheel.sh: the build failed; full log: $STAGE/build.log" >&2
  exit 1
fi
echo "built in $(( $(date +%s) - start )) s"
echo "== checking it"
"$PY" ci/check_wheel.py "$STAGE"/flashcore-*.whl "$WHEEL_DIR" | tee "$STAGE/check.log"
WHEEL=$(tail -n 1 "$STAGE/check.log")

[ "${WHEEL_INSTALL_CHECK:-1}" = 0 ] && exit 0
echo "== installing it in a fresh venv, without nvcc on PATH"
VENV=$(mktemp -d)/venv
"$PY" -m venv --system-site-packages "$VENV"   # sees this machine's torch, as a user's venv would
NO_NVCC_PATH=$(tr ':' '\n' <<< "$PATH" | while read -r d; do [ -n "$d" ] && [ ! -e "$d/nvcc" ] && echo "$d"; done | paste -sd:)
start=$(date +%s.%N)
# --no-deps --force-reinstall: torch is this machine's (seen through the system site-packages),
# and a flashcore installed there must not stand in for the wheel under test.
PATH="$VENV/bin:$NO_NVCC_PATH" "$VENV/bin/python" -m pip install -q --no-deps --force-reinstall "$WHEEL"
echo "installed in $(printf '%.1f' "$(echo "$(date +%s.%N) - $start" | bc)") s"
(cd "$VENV" && PATH="$VENV/bin:$NO_NVCC_PATH" "$VENV/bin/python" - <<'EOF'
import torch, flashcore
assert flashcore.__file__.startswith(__import__("sys").prefix), flashcore.__file__
print("flashcore", flashcore.__version__, "from", flashcore.__file__, "on torch", torch.__version__)
assert not flashcore.FALLBACK_ONLY, flashcore.FALLBACK_ONLY   # the library loaded
q = torch.randn(1, 2, 16, 64)
out = torch.ops.flashcore.sdpa(q, q, q, is_causal=True)
assert torch.equal(out, torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True))
print("CPU call:", flashcore.explain(q, q, q))
if torch.cuda.is_available():
    q = q.cuda().half()
    print("CUDA call:", flashcore.explain(q, q, q))
EOF
)
rm -rf "$(dirname "$VENV")"
