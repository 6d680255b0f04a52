#!/usr/bin/env bash
# The device call that measures f70b3b3 (the output in the query's storage order; landed without
# a GPU) against the layout before it, on one machine (~4 minutes on the H200 machine): one 90a
# build at D=64/128; the op library and package copied aside as tree b (this tree), rebuilt with
# output-layout-f70b3b3.patch reversed as tree a (the patch holds the change's layout parts as
# they stand at the session's HEAD; only flashcore_op.cpp recompiles), then b again. Then, a b a b:
# tools/masked_step_vs_aten.py at 512 / 1024 keys with 8 steps queued (its additive rows go to
# aten through the op: the route's copy, gone in b for these contiguous inputs) and
# tools/attention_out_vs_aten.py (HuggingFace's views: unchanged); then the layout tests on b.
# Everything lands in $OUT (8 files: steps_{a,b}{1,2}.json, attn_out_{a,b}.json, checks.log,
# run.log).
#   On the device: `git rev-parse HEAD > .git-sha` first, carry [".git-sha"]:
#   OUT=$OUT bash docs/experiments/prepared/run_output_layout.sh > $OUT/run.log 2>&1
set -uo pipefail
cd "$(dirname "$0")/../../.."
P=docs/experiments/prepared
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
sha=$(cat .git-sha 2>/dev/null || echo unknown)
PY=${PYTHON:-python3}
build() {
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE="$(command -v "$PY")" \
    -DFLASHCORE_CUDA_ARCHS=90a "-DFLASHCORE_HEAD_DIMS=64;128" > "$OUT/build.log" 2>&1 &&
    cmake --build build >> "$OUT/build.log" 2>&1
}
echo "=== build b ($(date +%T))"
build || { tail -n 30 "$OUT/build.log"; echo "BUILD FAILED"; exit 1; }
rm -rf _lay_a _lay_b && mkdir _lay_a _lay_b && cp -r python/flashcore _lay_b/
echo "=== build a: the patch reversed ($(date +%T))"
patch -p1 -R -s --no-backup-if-mismatch < "$P/output-layout-f70b3b3.patch" || { echo "REVERSE PATCH FAILED"; exit 1; }
build || { tail -n 30 "$OUT/build.log"; echo "BUILD FAILED (a)"; patch -p1 -s --no-backup-if-mismatch < "$P/output-layout-f70b3b3.patch"; exit 1; }
cp -r python/flashcore _lay_a/
patch -p1 -s --no-backup-if-mismatch < "$P/output-layout-f70b3b3.patch" || { echo "PATCH FAILED"; exit 1; }
# b's op library back in python/flashcore (the tests' conftest imports the in-tree package).
build || { tail -n 30 "$OUT/build.log"; echo "BUILD FAILED (b again)"; exit 1; }
rm -f "$OUT/build.log"

for pass in 1 2; do
  for t in a b; do
    echo "=== masked steps, tree $t, pass $pass ($(date +%T))"
    FLASHCORE_SHA="$sha$([ $t = a ] && echo '-layout-reversed')" PYTHONPATH=$PWD/_lay_$t:$PWD/tools \
      timeout 150 "$PY" tools/masked_step_vs_aten.py --dims 64,128 --forms hf,keys --lengths 512,1024 \
      --queue 8 --json "$OUT/steps_$t$pass.json" 2>&1 | tail -n 17
  done
done
for t in a b; do
  echo "=== attention as a model calls it, tree $t ($(date +%T))"
  FLASHCORE_SHA="$sha$([ $t = a ] && echo '-layout-reversed')" PYTHONPATH=$PWD/_lay_$t:$PWD/tools \
    timeout 120 "$PY" tools/attention_out_vs_aten.py --json "$OUT/attn_out_$t.json" 2>&1 | tail -n 8
done
{
  echo "=== layout tests, tree b ($(date +%T))"
  export PYTHONPATH=$PWD/_lay_b:$PWD/tools
  timeout 150 "$PY" -m pytest tests/test_gpu_autograd.py -q -p no:cacheprovider \
    -k "route_to_aten or lse_and_out" 2>&1 | tail -n 3
  timeout 200 "$PY" -m pytest tests/test_gpu_sdpa.py tests/test_gpu_attention.py -q -p no:cacheprovider 2>&1 | tail -n 3
  echo "=== end ($(date +%T))"
} > "$OUT/checks.log" 2>&1
cat "$OUT/checks.log"
