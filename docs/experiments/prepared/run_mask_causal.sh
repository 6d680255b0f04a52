#!/usr/bin/env bash
# The prepared sm90-bwd-mask-inside-causal.patch's device call: two trees (a = this tree, b = with
# the patch), D=64/128 90a builds; the C API test's backward cases on b (its causal masked cases)
# under memcheck; the mask tests on b; tools/ab.sh over the masked backward rows
# (FLASHCORE_TRAINING=flashcore); the masked training step against PyTorch on each tree.
# ~8 minutes on the H200 machine. Everything lands in $OUT.
#   On the device: `git rev-parse HEAD > .git-sha` here first, carry [".git-sha"]:
#   OUT=$OUT bash docs/experiments/prepared/run_mask_causal.sh   (PREP_ONLY=1: the trees alone)
cd "$(dirname "$0")/../../.." && . docs/experiments/prepared/common.sh
for t in _ma _mb; do copy_tree "$t"; done
(cd _mb && patch -p1 -s < "../$P/sm90-bwd-mask-inside-causal.patch") || { echo "PATCH FAILED"; exit 1; }
echo "$sha" > _ma/.git-sha; echo "$sha+mask-inside-causal" > _mb/.git-sha
echo "trees ready ($(date +%T))"
[ "${PREP_ONLY:-0}" = 1 ] && exit 0

CMAKE_ARGS="-DFLASHCORE_HEAD_DIMS=64;128 -DFLASHCORE_CUDA_ARCHS=90a" FLASHCORE_TRAINING=flashcore AB_IMPL=flashcore \
  bash tools/ab.sh _ma _mb -- --bwd-only --match "D=(64|128) bmask" --bf16 --impls cudnn,flashcore > "$OUT/ab.log" 2>&1
tail -n 20 "$OUT/ab.log"
rm -f "$OUT"/[ab][12].log
{
  echo "=== tree b: C API backward cases ($(date +%T))"
  (cd _mb/build && FC_TEST_BWD_ONLY=1 timeout 120 ./tests/c/test_c_api_gpu 2>&1 | grep -E "FAIL|causal=1 .*bool-mask|passed|failed" | tail -n 30)
  for tool in memcheck; do
    echo "=== $tool ($(date +%T))"
    (cd _mb/build && FC_TEST_BWD_ONLY=1 timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 \
       ./tests/c/test_c_api_gpu 2>&1 | tail -n 2)
  done
  for t in _ma _mb; do
    echo "=== masked training step, tree $t ($(date +%T))"
    (cd $t && PYTHONPATH=$PWD/python:$PWD/tools timeout 150 python3 tools/masked_step_vs_aten.py --dims 64,128 \
       --forms hf,keys,dense --lengths 1024,2048,4096 --json "$OUT/masked_step$t.json" 2>&1 | tail -n 19)
  done
  echo "=== pytest, tree b ($(date +%T))"
  export PYTHONPATH=$PWD/_mb/python:$PWD/_mb/tools
  (cd _mb && timeout 150 python3 -m pytest tests/test_gpu_masks.py -q -p no:cacheprovider 2>&1 | tail -n 2)
  (cd _mb && timeout 120 python3 -m pytest tests/test_gpu_autograd.py -q -k mask -p no:cacheprovider 2>&1 | tail -n 2)
  echo "=== end ($(date +%T))"
} > "$OUT/checks.log" 2>&1
cat "$OUT/checks.log"
