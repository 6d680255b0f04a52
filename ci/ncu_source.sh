#!/usr/bin/env bash
# Per-instruction warp-stall samples of FlashCore's sm90 forward and cuDNN's on one shape
# (Nsight Compute SourceCounters, SASS view), so the two kernels' schedules can be compared
# instruction by instruction: where each one's warps wait, and on what. Shape from the
# environment as in ci/ncu_sm90.sh (B, HQ, HKV, SQ, SK, D, CAUSAL; fp16). Run after a build on
# the GPU machine. Writes $OUT/ncu_source_<label>.ncu-rep and, from it, the SASS source page as
# CSV ($OUT/ncu_source_<label>.csv.gz: one row per instruction and kernel, with its samples).
# cuDNN's kernel is compiled at run time (libcudnn_engines_runtime_compiled), so this profile is
# the only place its SASS can be read.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
label=${LABEL:-B${B:-32}_H${HQ:-16}_S${SQ:-512}_D${D:-128}_c${CAUSAL:-0}}
rep="$OUT/ncu_source_$label"
timeout 300 ncu --kernel-name regex:"fwd_kernel|sdpa" --launch-skip 4 --launch-count 2 --section SourceCounters \
  --section WarpStateStats --import-source no -o "$rep" python3 ci/sm90_call.py > "$rep.log" 2>&1
echo "ncu rc $?"
timeout 120 ncu --import "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.csv" 2> "$rep.err"
echo "source page rc $? ($(wc -l < "$rep.csv") lines)"
gzip -f "$rep.csv"
