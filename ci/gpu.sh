#!/usr/bin/env bash
# The one script for a GPU machine: build (sm_89 + sm_90a), C tests, the full pytest suite,
# compute-sanitizer on the C API test (small and ragged shapes), a SASS check, and the bench.
# Everything it reports lands in $OUT (default ./gpu-out): build.log, ctest.log, pytest.log,
# sanitizer.log, sass.txt, bench.log, bench.json, paged.json, varlen.json, hf_packed.json,
# hf_cb.json, cp.json (2 GPUs).
#
# Every GPU step runs under `timeout`, so a hung kernel costs minutes, not the whole lease.
# Usage: bash ci/gpu.sh [--no-bench] [--quick-bench] [pytest -k expression]
# PYTEST_FILES="tests/a.py tests/b.py" runs only those files; BENCH_ARGS adds bench.py options.
# FLASHCORE_CUDA_ARCHS=90a (and FLASHCORE_HEAD_DIMS, FLASHCORE_DTYPES) trim the build; SANITIZERS=0
# skips compute-sanitizer.
# WHEEL=dist/flashcore-*.whl tests a prebuilt wheel (ci/build_wheel.sh) instead of a build: no
# build, C tests or sanitizers; the wheel is installed (pip --target, no dependencies) and the
# tests and the bench import it, not the working tree.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
BENCH=full
KEXPR=""
for arg in "$@"; do
  case "$arg" in
    --no-bench) BENCH=none ;;
    --quick-bench) BENCH=quick ;;
    *) KEXPR="$arg" ;;
  esac
done
status=0
step() { echo; echo "=== $* ($(date +%T))"; }

# The device copy of a tree is not the sender's checkout (its .git, if any, may name another
# commit): `git rev-parse HEAD > .git-sha` beforehand, and that file wins when present. It is
# git-ignored, so a device call copies it only when its carry names it (or set FLASHCORE_SHA).
if [ -z "${FLASHCORE_SHA:-}" ]; then
  FLASHCORE_SHA=$(cat .git-sha 2>/dev/null || git rev-parse HEAD 2>/dev/null || echo unknown)
fi
export FLASHCORE_SHA

step "machine"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv | tee "$OUT/machine.txt"
"$PY" -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())" | tee -a "$OUT/machine.txt"

if [ -n "${WHEEL:-}" ]; then
  step "installing $WHEEL (no build)"
  SITE=${TMPDIR:-/tmp}/flashcore-wheel-site  # (not under $OUT: the library is ~90 MB)
  rm -rf "$SITE"
  "$PY" -m pip install -q --no-deps --no-index --target "$SITE" $WHEEL || { echo "WHEEL INSTALL FAILED"; exit 1; }
  # tests/conftest.py imports the working tree's package where a build left libraries in it.
  rm -f python/flashcore/libflashcore*.so
  export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
  (cd /tmp && "$PY" -c "import flashcore, torch; import flashcore._build_config as b; print('flashcore from', flashcore.__file__, 'built with', getattr(b, 'TOOLCHAIN', '?')); q = torch.zeros(1, 1, 8, 64, device='cuda', dtype=torch.bfloat16); print('explain:', flashcore.explain(q, q, q))") || status=1
else  # the build, the SASS counts, the C tests and the sanitizers, up to the matching fi
step "build"
# FLASHCORE_CUDA_ARCHS / FLASHCORE_HEAD_DIMS / FLASHCORE_DTYPES trim the build as in CMakeLists.txt
# (the default, 89;90a, took ~5 min of device time on the H200 machine).
# An unset variable drops its cache entry (-U), so a trimmed build left in build/ by an earlier
# call on the same machine does not trim this one.
cache_arg() { if [ -n "${!1:-}" ]; then echo "-D$1=${!1}"; else echo "-U$1"; fi; }
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE="$(command -v "$PY")" \
  "$(cache_arg FLASHCORE_CUDA_ARCHS)" "$(cache_arg FLASHCORE_HEAD_DIMS)" "$(cache_arg FLASHCORE_DTYPES)" \
  > "$OUT/build.log" 2>&1 && cmake --build build >> "$OUT/build.log" 2>&1
if [ $? -ne 0 ]; then tail -n 40 "$OUT/build.log"; echo "BUILD FAILED"; exit 1; fi
grep TOOLCHAIN python/flashcore/_build_config.py | tee -a "$OUT/machine.txt"
grep -E "registers|spill" "$OUT/build.log" | sort | uniq -c | sort -rn | head -n 12

step "SASS: tensor-core and async-copy instructions per kernel"
cuobjdump -sass python/flashcore/libflashcore.so > "$OUT/sass_full.txt" 2>&1
awk '/Function :/ {f=$3; seen[f]=1} /HMMA/ {h[f]++} /LDGSTS/ {l[f]++} /HGMMA/ {g[f]++}
     END {for (k in seen) printf "%-90s HMMA %5d  LDGSTS %4d  HGMMA %4d\n", k, h[k], l[k], g[k]}' \
  "$OUT/sass_full.txt" | tee "$OUT/sass.txt"
rm -f "$OUT/sass_full.txt"

step "C tests"
ctest --test-dir build --output-on-failure --timeout 120 2>&1 | tee "$OUT/ctest.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

step "compute-sanitizer (memcheck, racecheck, synccheck, initcheck) on the C API test; memcheck on the paged test"
# SANITIZERS=0 skips this step (~2.5 min of device time) for quick checks of a change.
[ "${SANITIZERS:-1}" = 0 ] && echo "skipped (SANITIZERS=0)"
for tool in $([ "${SANITIZERS:-1}" = 0 ] || echo memcheck racecheck synccheck initcheck); do
  timeout 300 compute-sanitizer --tool "$tool" --error-exitcode 9 build/tests/c/test_c_api_gpu > "$OUT/sanitizer_$tool.log" 2>&1
  rc=$?
  tail -n 3 "$OUT/sanitizer_$tool.log"
  if [ $rc -ne 0 ]; then echo "SANITIZER $tool FAILED (rc $rc)"; status=1; fi
done
# The paged decode test's out-of-range block tables must read nothing outside the pools.
rc=0
[ "${SANITIZERS:-1}" = 0 ] || { timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 build/tests/c/test_paged_gpu > "$OUT/sanitizer_paged_memcheck.log" 2>&1; rc=$?; }
[ "${SANITIZERS:-1}" = 0 ] || tail -n 3 "$OUT/sanitizer_paged_memcheck.log"
if [ $rc -ne 0 ] && [ $rc -ne 77 ]; then echo "SANITIZER memcheck (paged) FAILED (rc $rc)"; status=1; fi
cat "$OUT"/sanitizer_*.log > "$OUT/sanitizer.log" 2>/dev/null; rm -f "$OUT"/sanitizer_*.log
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
fi

step "pytest"
# One pytest process per file: a crash (a signal inside a library) then costs one file's
# results, not the rest of the suite's.
: > "$OUT/pytest.log"
# Each file's seconds are printed beside it: the whole suite takes longer than one 600 s device
# call, so a session splits it across calls with PYTEST_FILES by these numbers.
for f in ${PYTEST_FILES:-tests/test_*.py}; do
  t0=$SECONDS
  PYTHONUNBUFFERED=1 timeout ${PYTEST_TIMEOUT:-300} "$PY" -m pytest "$f" -q -ra -p no:cacheprovider \
    ${KEXPR:+-k "$KEXPR"} >> "$OUT/pytest.log" 2>&1
  rc=$?
  # 5: no test selected in this file (a -k expression); not a failure.
  if [ $rc -ne 0 ] && [ $rc -ne 5 ]; then status=1; echo "FAILED: $f (rc $rc, $((SECONDS - t0)) s)"
  else echo "ok: $f ($((SECONDS - t0)) s)"; fi
done
grep -E "^(FAILED|ERROR)|Fatal Python error" "$OUT/pytest.log" | cut -c1-200 | head -n 20

if [ "$BENCH" != none ]; then
  step "bench ($BENCH)"
  extra=""; [ "$BENCH" = quick ] && extra="--quick"
  PYTHONUNBUFFERED=1 timeout 400 "$PY" bench/bench.py $extra ${BENCH_ARGS:-} --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  step "paged decoding bench"
  PYTHONUNBUFFERED=1 timeout 120 "$PY" bench/bench_paged.py $extra --json "$OUT/paged.json" 2>&1 | tee -a "$OUT/bench.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  step "packed (varlen) bench"
  PYTHONUNBUFFERED=1 timeout 300 "$PY" bench/bench_varlen.py $extra --json "$OUT/varlen.json" 2>&1 | tee -a "$OUT/bench.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  step "HuggingFace padding-free training step"
  PYTHONUNBUFFERED=1 timeout 300 "$PY" bench/bench_hf_packed.py $([ "$BENCH" = quick ] && echo "--layers 2 --iters 3") --json "$OUT/hf_packed.json" 2>&1 | tee -a "$OUT/bench.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  step "HuggingFace continuous batching"
  PYTHONUNBUFFERED=1 timeout 300 "$PY" bench/bench_hf_cb.py --requests 32 --new 64 --layers 4 --iters 2 --json "$OUT/hf_cb.json" 2>&1 | tee -a "$OUT/bench.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  step "context-parallel bench (2 GPUs; one line and nothing run elsewhere)"
  cp_seqs=""; [ "$BENCH" = quick ] && cp_seqs="--seqs 64k"
  PYTHONUNBUFFERED=1 timeout 300 "$PY" bench/bench_cp.py $cp_seqs --json "$OUT/cp.json" 2>&1 | tee -a "$OUT/bench.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

step "done: status $status"
exit $status
