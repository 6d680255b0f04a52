#!/usr/bin/env bash
# Runs every test: the C tests (ctest, from ./build), the libFuzzer pass over the C layer
# (ci/fuzz.sh) and the op tests (pytest).
# GPU tests run where a CUDA device is present; elsewhere each is skipped with a reason, and
# pytest's summary counts them per file (tests/conftest.py). Steps that cannot run here (the
# fuzz step without clang or CUDA's headers; the C tests without a CMake build) are skipped,
# saying what they need, and listed again at the end.
# With a flashcore installed without kernels (ci/install.sh without nvcc), only the tests of
# that install run (tests/test_fallback.py): the others need the compiled library.
# Run after `bash ci/install.sh`. Usage: bash ci/test.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
NOTES=()
say_skipped() {
  [ ${#NOTES[@]} -eq 0 ] && return
  echo "== ci/test.sh: steps skipped here"
  printf '  %s\n' "${NOTES[@]}"
}
trap say_skipped EXIT

echo "== C tests"
if [ -f build/CTestTestfile.cmake ]; then
  ctest --test-dir build --output-on-failure
else
  NOTES+=("SKIP C tests: no CMake build in ./build (ci/install.sh makes one where nvcc is on PATH)")
  echo "${NOTES[-1]}"
fi
mkdir -p build/fuzz
# libFuzzer over c_src validation, 400000 inputs from a fixed seed (issue 8)
bash ci/fuzz.sh | tee build/fuzz/step.log
while IFS= read -r line; do NOTES+=("$line"); done < <(grep '^SKIP' build/fuzz/step.log || true)

# Which flashcore pytest will test (tests/conftest.py: the working tree's build, else the
# installed copy), and whether it has its compiled library.
FALLBACK=$("$PY" -c "
import os, sys
if os.path.exists('python/flashcore/libflashcore_op.so'):
    sys.path.insert(0, 'python')
import flashcore
print(flashcore.FALLBACK_ONLY)")
echo "== op tests"
if [ -n "$FALLBACK" ]; then
  NOTES+=("SKIP op tests but tests/test_fallback.py: flashcore here falls back to PyTorch ($FALLBACK)")
  echo "${NOTES[-1]}"
  "$PY" -m pytest tests/test_fallback.py -ra "$@"
else
  "$PY" -m pytest tests -ra "$@"
fi
