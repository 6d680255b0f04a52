#!/usr/bin/env bash
# The prepared patches' device call (fiftieth session's two, docs/experiments/prepared/README.md):
# three trees side by side, a = this tree, b = + sm90-bwd-d256-mask-tiles.patch, c = b +
# sm90-bwd-d256-masked-row-reductions.patch; tools/ab.sh over the D=256 backward rows (fp16 and
# bf16, cuDNN beside them, FLASHCORE_TRAINING=flashcore); then tree b's checks: the C API test's
# backward cases under memcheck and racecheck, the D=256 gradient and mask tests, and the masked
# training step against PyTorch. Everything lands in $OUT (ab.txt, the JSONs, checks.log).
#   On the device (~7 minutes): `git rev-parse HEAD > .git-sha` here first, then a device call
#   with carry [".git-sha"]: OUT=$OUT bash docs/experiments/prepared/run.sh
#   PREP_ONLY=1 makes the three trees and stops (a check on a machine without a GPU).
cd "$(dirname "$0")/../../.." && . docs/experiments/prepared/common.sh
for t in _pa _pb _pc; do copy_tree "$t"; done
(cd _pb && patch -p1 -s < "../$P/sm90-bwd-d256-mask-tiles.patch") || { echo "PATCH FAILED: mask tiles"; exit 1; }
(cd _pc && patch -p1 -s < "../$P/sm90-bwd-d256-mask-tiles.patch" &&
           patch -p1 -s < "../$P/sm90-bwd-d256-masked-row-reductions.patch") || { echo "PATCH FAILED: row reductions"; exit 1; }
echo "$sha" > _pa/.git-sha; echo "$sha+mask-tiles" > _pb/.git-sha; echo "$sha+mask-tiles+row-reductions" > _pc/.git-sha
echo "trees ready ($(date +%T))"
[ "${PREP_ONLY:-0}" = 1 ] && exit 0

CMAKE_ARGS="-DFLASHCORE_HEAD_DIMS=256 -DFLASHCORE_CUDA_ARCHS=90a" FLASHCORE_TRAINING=flashcore AB_IMPL=flashcore \
  bash tools/ab.sh _pa _pb _pc -- --bwd-only --match D=256 --bf16 --impls cudnn,flashcore > "$OUT/ab.log" 2>&1
tail -n 30 "$OUT/ab.log"
rm -f "$OUT"/[abc][12].log

{
  echo "=== tree b: C API backward cases ($(date +%T))"
  (cd _pb/build && FC_TEST_BWD_ONLY=1 timeout 120 ./tests/c/test_c_api_gpu 2>&1 | grep -E "FAIL|passed|failed" | tail -5)
  for tool in memcheck racecheck; do
    echo "=== $tool ($(date +%T))"
    (cd _pb/build && FC_TEST_BWD_ONLY=1 timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 \
       ./tests/c/test_c_api_gpu 2>&1 | tail -n 2)
  done
  echo "=== pytest ($(date +%T))"
  export PYTHONPATH=$PWD/_pb/python:$PWD/_pb/tools
  (cd _pb && timeout 120 python3 -m pytest tests/test_gpu_autograd.py -q -k d256 -p no:cacheprovider 2>&1 | tail -n 2)
  (cd _pb && timeout 120 python3 -m pytest tests/test_gpu_masks.py -q -k 256 -p no:cacheprovider 2>&1 | tail -n 2)
  echo "=== masked training step, tree b ($(date +%T))"
  (cd _pb && timeout 150 python3 tools/masked_step_vs_aten.py --dims 256 --forms hf,keys,dense \
     --lengths 1024,2048,4096 --json "$OUT/masked_step_d256_tiles.json" 2>&1 | tail -n 12)
  echo "=== end ($(date +%T))"
} > "$OUT/checks.log" 2>&1
cat "$OUT/checks.log"
