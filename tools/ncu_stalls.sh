#!/usr/bin/env bash
# Warp stall breakdown of a FlashCore forward beside its peer's on one shape (Nsight Compute,
# one call of each): per stall reason, warps stalled per issued instruction, and the counts
# behind them (time, instructions, tensor-pipe and issue activity, ldmatrix, shared-memory
# wavefronts and bank conflicts, registers and occupancy), the two kernels side by side.
#   PEER=cudnn (default): the sm90 family beside cuDNN's kernel (tools/sm90_call.py);
#   PEER=flash: the sm80 family, forced, beside FlashAttention-2, PyTorch's flash backend
#               (tools/sm80_call.py).
# Shape from the environment (B, HQ, HKV, SQ, SK, D, CAUSAL; fp16). Run after a build on the GPU
# machine; the table goes to stdout and $OUT/ncu_stalls_<label>.csv (LABEL, default the shape).
# --source: per SASS instruction instead (SourceCounters): $OUT/ncu_source_<label>.ncu-rep and
# its source page as CSV (ncu_source_<label>.csv.gz, a row per instruction and kernel, with its
# stall samples). cuDNN's kernel is compiled at run time (libcudnn_engines_runtime_compiled), so
# a profile is the only place its SASS can be read.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
PEER=${PEER:-cudnn}
case "$PEER" in
  cudnn) call=tools/sm90_call.py; kernels="fwd_kernel|sdpa" ;;
  flash) call=tools/sm80_call.py; kernels="fwd_kernel" ;;
  *) echo "PEER must be cudnn or flash" >&2; exit 2 ;;
esac
label=${LABEL:-${PEER}_B${B:-32}_H${HQ:-16}_S${SQ:-512}_D${D:-128}_c${CAUSAL:-0}}
if [ "${1:-}" = "--source" ]; then
  rep="$OUT/ncu_source_$label"
  timeout 300 ncu --kernel-name regex:"$kernels" --launch-skip 4 --launch-count 2 --section SourceCounters \
    --section WarpStateStats --import-source no -o "$rep" python3 "$call" > "$rep.log" 2>&1
  echo "ncu rc $?"
  timeout 120 ncu --import "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.csv" 2> "$rep.err"
  echo "source page rc $? ($(wc -l < "$rep.csv") lines)"
  gzip -f "$rep.csv"
  exit 0
fi
metrics="gpu__time_duration.sum,smsp__inst_executed.sum,smsp__issue_active.avg.per_cycle_active"
metrics+=",sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
metrics+=",l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"
metrics+=",l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"
metrics+=",smsp__inst_executed_op_ldsm.sum,smsp__inst_executed_pipe_fma.sum,smsp__inst_executed_pipe_alu.sum"
metrics+=",smsp__inst_executed_pipe_xu.sum,smsp__inst_executed_op_shared_ld.sum"
metrics+=",sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__grid_size"
metrics+=",launch__shared_mem_per_block_dynamic,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem"
metrics+=",regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
timeout 300 ncu --kernel-name regex:"$kernels" --launch-skip 4 --launch-count 2 --csv --page raw \
  --metrics "$metrics" python3 "$call" > "$OUT/ncu_stalls_$label.csv" 2> "$OUT/ncu_stalls_$label.err"
echo "ncu rc $?"
python3 - "$OUT/ncu_stalls_$label.csv" <<'PY'
import csv, sys
lines = [l for l in open(sys.argv[1]) if l.startswith('"')]
rows = list(csv.reader(lines))
if len(rows) < 3:
    print("no ncu rows"); sys.exit(0)
head, data = rows[0], rows[2:]  # row 1 holds units
name_col = head.index("Kernel Name")
def who(name):
    return "flashcore" if "flashcore" in name else "cudnn" if "sdpa" in name else "flash"
names = [who(r[name_col]) for r in data]
def num(x):
    try: return float(x.replace(",", ""))
    except ValueError: return 0.0
print(f"{'metric':<75}" + "".join(f"{n:>14}" for n in names))
for i, h in enumerate(head):
    if not h.startswith(("gpu__", "smsp__", "sm__", "l1tex__", "launch__")): continue
    v = [num(r[i]) for r in data]
    if max(v) < 0.01: continue
    short = h.replace("smsp__average_warps_issue_stalled_", "stall ").replace("_per_issue_active.ratio", "")
    print(f"{short:<75}" + "".join(f"{x:>14.4g}" for x in v))
PY
