#!/usr/bin/env bash
# Warp stall breakdown of FlashCore's sm90 forward beside cuDNN's on one shape (Nsight Compute,
# one call of each): per stall reason, warps stalled per issued instruction, so the two kernels'
# reasons can be compared line by line. Shape from the environment as in ci/ncu_sm90.sh (B, HQ,
# HKV, SQ, SK, D, CAUSAL; fp16). Run after a build on the GPU machine; the table goes to stdout
# and $OUT/ncu_stalls_<label>.csv (LABEL, default the shape).
# --source: per SASS instruction instead (SourceCounters): $OUT/ncu_source_<label>.ncu-rep and
# its source page as CSV (ncu_source_<label>.csv.gz, a row per instruction and kernel, with its
# stall samples). cuDNN's kernel is compiled at run time (libcudnn_engines_runtime_compiled), so
# a profile is the only place its SASS can be read.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
label=${LABEL:-B${B:-32}_H${HQ:-16}_S${SQ:-512}_D${D:-128}_c${CAUSAL:-0}}
if [ "${1:-}" = "--source" ]; then
  rep="$OUT/ncu_source_$label"
  timeout 300 ncu --kernel-name regex:"fwd_kernel|sdpa" --launch-skip 4 --launch-count 2 --section SourceCounters \
    --section WarpStateStats --import-source no -o "$rep" python3 ci/sm90_call.py > "$rep.log" 2>&1
  echo "ncu rc $?"
  timeout 120 ncu --import "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.csv" 2> "$rep.err"
  echo "source page rc $? ($(wc -l < "$rep.csv") lines)"
  gzip -f "$rep.csv"
  exit 0
fi
timeout 300 ncu --kernel-name regex:"fwd_kernel|sdpa" --launch-skip 4 --launch-count 2 --csv --page raw \
  --metrics "gpu__time_duration.sum,smsp__issue_active.avg.per_cycle_active,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
  python3 ci/sm90_call.py > "$OUT/ncu_stalls_$label.csv" 2> "$OUT/ncu_stalls_$label.err"
echo "ncu rc $?"
python3 - "$OUT/ncu_stalls_$label.csv" <<'PY'
import csv, sys
lines = [l for l in open(sys.argv[1]) if l.startswith('"')]
rows = list(csv.reader(lines))
if len(rows) < 3:
    print("no ncu rows"); sys.exit(0)
head, data = rows[0], rows[2:]  # row 1 holds units
name_col = head.index("Kernel Name")
names = ["cudnn" if "sdpa" in r[name_col] else "flashcore" for r in data]
metrics = [i for i, h in enumerate(head) if h.startswith(("gpu__", "smsp__"))]
vals = {h: [r[i] for r in data] for i, h in ((i, head[i]) for i in metrics)}
def num(x):
    try: return float(x.replace(",", ""))
    except ValueError: return 0.0
order = sorted(vals, key=lambda h: -max(num(v) for v in vals[h]))
print(f"{'metric':<75}" + "".join(f"{n:>12}" for n in names))
for h in order:
    if max(num(v) for v in vals[h]) < 0.01: continue
    short = h.replace("smsp__average_warps_issue_stalled_", "stall ").replace("_per_issue_active.ratio", "")
    print(f"{short:<75}" + "".join(f"{num(v):>12.3f}" for v in vals[h]))
PY
