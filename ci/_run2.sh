set -u
export PYTHONPATH=$PWD/python
OUT=$OUT PYTEST_TIMEOUT=240 PYTEST_FILES="tests/test_gpu_sdpa.py tests/test_patch.py tests/test_streams_devices.py tests/test_gpu_autograd.py" timeout 440 bash ci/gpu.sh --no-bench > $OUT/gpu.txt 2>&1; echo "gpu.sh rc $?"
grep -E "^===|^ok:|FAILED|passed|failed" $OUT/gpu.txt | tail -22
grep -E "passed|failed" $OUT/pytest.log | tail -5
M='S=128x4096|B=1 H=16 S=1024 D=128|B=1 H=8 S=512 '
for s in 1 2 3 4 auto; do
  if [ $s = auto ]; then unset FLASHCORE_KV_SPLITS; else export FLASHCORE_KV_SPLITS=$s; fi
  timeout 40 python3 bench/bench.py --extra --no-bwd --impls cudnn,flashcore --match "$M" --json $OUT/split_$s.json > $OUT/split_$s.log 2>&1 || echo "bench $s failed"
done
unset FLASHCORE_KV_SPLITS
python3 bench/compare.py $OUT/split_1.json $OUT/split_2.json $OUT/split_3.json $OUT/split_4.json $OUT/split_auto.json --impl flashcore 2>&1 | tail -12
grep -E "flashcore|cudnn" $OUT/split_auto.log | head -20
tar czf $OUT/logs.tgz -C $OUT pytest.log sanitizer.log ctest.log build.log 2>/dev/null
