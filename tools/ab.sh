#!/usr/bin/env bash
# A/B(/C...) of source trees on one GPU machine: build each (in its own build/), then run
# bench/bench.py on them in turn (A B A B ...), each pass with its own JSON, and print
# bench/compare.py's table (cuDNN time / FlashCore time per shape and pass, geomean).
#
# Usage: bash tools/ab.sh TREE_A TREE_B [TREE_C ...] [-- bench.py options...]
#   PASSES (default 2) passes per tree; OUT (default ./gpu-out) receives a1.json, b1.json, ...,
#   ab_build_a.log, ab_build_b.log, ... and ab.txt. Default bench options: --impls cudnn,flashcore --no-bwd.
#   AB_ENV_a, AB_ENV_b, ... add environment settings to one tree's passes (a tree may be given
#   twice, e.g. AB_ENV_b="FLASHCORE_SM90_SHORT=1" for a run-time switch).
#   AB_IMPL / AB_REF pick the compared impl and its reference (default flashcore against cudnn;
#   e.g. AB_IMPL=flashcore-sm80 AB_REF=flash with --impls flash,flashcore-sm80).
#   AB_TIME_WRONG=1: trees that compute wrong results on purpose (a stage left out, to see what it
#   costs) are timed anyway: bench.py --time-wrong, compare.py --allow-wrong.
#   CMAKE_ARGS adds configure options (e.g. "-DFLASHCORE_HEAD_DIMS=128 -DFLASHCORE_DTYPES=fp16
#   -DFLASHCORE_CUDA_ARCHS=90a" for a faster build when the bench rows need no more).
# Make the trees with `git archive REV | tar -x -C DIR && git rev-parse REV > DIR/.git-sha` (the
# device copies no .git; bench.py takes a snapshot's commit from its .git-sha). A tree's .git-sha
# is git-ignored by the tree's own .gitignore: name each in the device call's carry (or set
# AB_ENV_a="FLASHCORE_SHA=..."), else the JSONs say "unknown".
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
TREES=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do TREES+=("$(cd "$1" && pwd)"); shift; done
[ $# -gt 0 ] && shift
ARGS=("$@")
[ ${#ARGS[@]} -eq 0 ] && ARGS=(--impls cudnn,flashcore --no-bwd)
LABELS=(a b c d e f g h)
# The trees build at the same time (ninja shares the machine's cores among them: on the 16-core
# GPU machine two trimmed builds take about as long as one), each into its own log.
pids=()
for i in "${!TREES[@]}"; do
  tree=${TREES[$i]}
  echo "=== build ${LABELS[$i]}: $tree ($(date +%T))"
  (cd "$tree" && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
     -DPython3_EXECUTABLE="$(command -v "$PY")" ${CMAKE_ARGS:-} && cmake --build build) > "$OUT/ab_build_${LABELS[$i]}.log" 2>&1 &
  pids+=($!)
done
for i in "${!TREES[@]}"; do
  wait "${pids[$i]}" || { tail -n 30 "$OUT/ab_build_${LABELS[$i]}.log"; echo "BUILD FAILED: ${TREES[$i]}"; exit 1; }
done
echo "=== built ($(date +%T))"
files=()
for pass in $(seq 1 "${PASSES:-2}"); do
  for i in "${!TREES[@]}"; do
    tree=${TREES[$i]}; name=${LABELS[$i]}$pass
    echo "=== pass $pass, ${LABELS[$i]} ($(date +%T))"
    env_var=AB_ENV_${LABELS[$i]}
    (cd "$tree" && env ${!env_var:-} PYTHONPATH=$tree/python timeout 300 "$PY" bench/bench.py "${ARGS[@]}" ${AB_TIME_WRONG:+--time-wrong} \
       --json "$OUT/$name.json") > "$OUT/$name.log" 2>&1 || { tail -n 20 "$OUT/$name.log"; echo "BENCH FAILED: $name"; }
    files+=("$OUT/$name.json")
  done
done
"$PY" "${TREES[0]}/bench/compare.py" "${files[@]}" --impl "${AB_IMPL:-flashcore}" ${AB_REF:+--ref "$AB_REF"} \
  ${AB_TIME_WRONG:+--allow-wrong} | tee "$OUT/ab.txt"
