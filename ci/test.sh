#!/usr/bin/env bash
# Runs every test: the C tests (ctest, from ./build) and the op tests (pytest).
# GPU tests run where a CUDA device is present and are skipped (with a reason) elsewhere.
# Run after `bash ci/install.sh`. Usage: bash ci/test.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
echo "== C tests"
ctest --test-dir build --output-on-failure
bash ci/fuzz.sh  # libFuzzer over c_src validation, 400000 inputs from a fixed seed (issue 8); skips only if clang cannot be installed
echo "== op tests"
"$PY" -m pytest tests -ra "$@"
