#!/usr/bin/env bash
# The prepared sm90-d256-mask-inside-causal.patch's device call (~6 minutes on the H200 machine):
# two trees (a = this tree, b = with the patch), 90a builds at D=256; tools/ab.sh over the D=256
# masked rows, forward and backward (FLASHCORE_TRAINING=flashcore); on b the C API test (its
# D=256 causal bool-mask cases) and its memcheck, the D=256 mask tests and the masked training
# step on each tree. Everything lands in $OUT (at most 8 files come back: ab.txt, a1/b1.json,
# checks.log, masked_step_{a,b}.json).
#   On the device: `git rev-parse HEAD > .git-sha` first, carry [".git-sha"]:
#   OUT=$OUT bash docs/experiments/prepared/run_d256_mask_causal.sh   (PREP_ONLY=1: the trees alone)
set -uo pipefail
cd "$(dirname "$0")/../../.."
P=docs/experiments/prepared
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
sha=$(cat .git-sha 2>/dev/null || echo unknown)
for t in _ma _mb; do
  rm -rf "$t" && mkdir "$t" &&
    tar --exclude='./_*' --exclude=./build --exclude=./.git --exclude=./gpu-out -cf - . | tar -xf - -C "$t"
done
(cd _mb && patch -p1 -s < "../$P/sm90-d256-mask-inside-causal.patch") || { echo "PATCH FAILED"; exit 1; }
echo "trees ready ($(date +%T))"
[ "${PREP_ONLY:-0}" = 1 ] && exit 0

CMAKE_ARGS="-DFLASHCORE_HEAD_DIMS=256 -DFLASHCORE_CUDA_ARCHS=90a" FLASHCORE_TRAINING=flashcore AB_IMPL=flashcore \
  AB_ENV_a="FLASHCORE_SHA=$sha" AB_ENV_b="FLASHCORE_SHA=$sha+d256-mask-inside-causal" \
  bash tools/ab.sh _ma _mb -- --match "D=256 bmask" --bf16 --impls cudnn,flashcore > "$OUT/ab.log" 2>&1
tail -n 12 "$OUT/ab.log"
rm -f "$OUT"/[ab][12].log "$OUT"/ab_build_*.log "$OUT"/ab.log "$OUT"/a2.json "$OUT"/b2.json
{
  echo "=== tree b: C API, D=256 causal bool-mask cases ($(date +%T))"
  (cd _mb/build && timeout 120 ./tests/c/test_c_api_gpu 2>&1 | grep -E "FAIL|D=256 causal=1 .*bool-mask|passed|failed" | tail -n 16)
  echo "=== memcheck ($(date +%T))"
  (cd _mb/build && timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 ./tests/c/test_c_api_gpu 2>&1 | tail -n 2)
  export PYTHONPATH=$PWD/_mb/python:$PWD/_mb/tools
  echo "=== pytest, tree b ($(date +%T))"
  (cd _mb && timeout 120 python3 -m pytest tests/test_gpu_masks.py -q -k "256 or inside_causal" -p no:cacheprovider 2>&1 | tail -n 2)
  (cd _mb && timeout 120 python3 -m pytest tests/test_gpu_autograd.py -q -k "d256" -p no:cacheprovider 2>&1 | tail -n 2)
  for t in _ma _mb; do
    echo "=== masked training step, tree $t ($(date +%T))"
    (cd $t && PYTHONPATH=$PWD/python:$PWD/tools timeout 100 python3 tools/masked_step_vs_aten.py --dims 256 \
       --forms hf,keys --lengths 1024,4096 --json "$OUT/masked_step_$t.json" 2>&1 | tail -n 8)
  done
  echo "=== end ($(date +%T))"
} > "$OUT/checks.log" 2>&1
cat "$OUT/checks.log"
