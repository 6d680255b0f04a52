#!/usr/bin/env bash
# The sm80-class forward (forced) beside PyTorch's flash backend (FlashAttention-2) on one shape,
# in Nsight Compute (one call of each): time, instructions, tensor-pipe and issue activity,
# shared-memory wavefronts and bank conflicts, occupancy and registers, and warps stalled per
# issued instruction by reason, side by side. Shape from the environment as ci/sm80_call.py
# (B, HQ, HKV, SQ, SK, D, CAUSAL; fp16). Run after a build on the GPU machine; the table goes to
# stdout and $OUT/ncu_sm80_<label>.csv (LABEL, default the shape).
# --source: per SASS instruction instead (SourceCounters), as ci/ncu_stalls.sh --source:
# $OUT/ncu_sm80_source_<label>.csv.gz.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
label=${LABEL:-B${B:-8}_H${HQ:-16}_S${SQ:-2048}_D${D:-128}_c${CAUSAL:-0}}
if [ "${1:-}" = "--source" ]; then
  rep="$OUT/ncu_sm80_source_$label"
  timeout 300 ncu --kernel-name regex:"fwd_kernel" --launch-skip 4 --launch-count 2 --section SourceCounters \
    --section WarpStateStats --import-source no -o "$rep" python3 ci/sm80_call.py > "$rep.log" 2>&1
  echo "ncu rc $?"
  timeout 120 ncu --import "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.csv" 2> "$rep.err"
  echo "source page rc $? ($(wc -l < "$rep.csv") lines)"
  gzip -f "$rep.csv"
  rm -f "$rep.ncu-rep"
  exit 0
fi
metrics="gpu__time_duration.sum,smsp__inst_executed.sum,smsp__issue_active.avg.per_cycle_active"
metrics+=",sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
metrics+=",l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"
metrics+=",l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"
metrics+=",smsp__inst_executed_op_ldsm.sum,smsp__inst_executed_pipe_fma.sum,smsp__inst_executed_pipe_alu.sum"
metrics+=",smsp__inst_executed_pipe_xu.sum,smsp__inst_executed_op_shared_ld.sum"
metrics+=",sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__grid_size"
metrics+=",launch__block_size,launch__shared_mem_per_block_dynamic,launch__occupancy_limit_registers"
metrics+=",launch__occupancy_limit_shared_mem,dram__throughput.avg.pct_of_peak_sustained_elapsed"
metrics+=",regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
timeout 300 ncu --kernel-name regex:"fwd_kernel" --launch-skip 4 --launch-count 2 --csv --page raw \
  --metrics "$metrics" python3 ci/sm80_call.py > "$OUT/ncu_sm80_$label.csv" 2> "$OUT/ncu_sm80_$label.err"
echo "ncu rc $?"
python3 - "$OUT/ncu_sm80_$label.csv" <<'PY'
import csv, sys
lines = [l for l in open(sys.argv[1]) if l.startswith('"')]
rows = list(csv.reader(lines))
if len(rows) < 3:
    print("no ncu rows"); sys.exit(0)
head, data = rows[0], rows[2:]  # row 1 holds units
name_col = head.index("Kernel Name")
names = ["flashcore" if "flashcore" in r[name_col] else "flash" for r in data]
metrics = [i for i, h in enumerate(head) if h.startswith(("gpu__", "smsp__", "sm__", "l1tex__", "launch__", "dram__"))]
def num(x):
    try: return float(x.replace(",", ""))
    except ValueError: return 0.0
print(f"{'metric':<75}" + "".join(f"{n:>14}" for n in names))
for i in metrics:
    v = [num(r[i]) for r in data]
    if max(v) < 0.01: continue
    short = head[i].replace("smsp__average_warps_issue_stalled_", "stall ").replace("_per_issue_active.ratio", "")
    print(f"{short:<75}" + "".join(f"{x:>14.4g}" for x in v))
PY
