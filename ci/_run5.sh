set -u
export PYTHONPATH=$PWD/python
build() { cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHCORE_HEAD_DIMS="64;128" -DPython3_EXECUTABLE=$(command -v python3) > $OUT/build_$1.log 2>&1 && cmake --build build >> $OUT/build_$1.log 2>&1 || { tail -20 $OUT/build_$1.log; exit 1; }; }
M='B=1 H=8 S=512 |S=128x4096|S=256x8192|S=256x32768'
bench() { timeout 60 python3 bench/bench.py --extra --no-bwd --impls cudnn,flashcore --match "$M" --json $OUT/$1.json > $OUT/$1.log 2>&1; FLASHCORE_KV_SPLITS=4 timeout 60 python3 bench/bench.py --extra --no-bwd --impls cudnn,flashcore --match "$M" --json $OUT/$1_s4.json > /dev/null 2>&1; }
build a; bench online
patch -p1 < ci/_twopass.patch > /dev/null
build b; bench twopass
bench twopass_r
patch -R -p1 < ci/_twopass.patch > /dev/null
build c; bench online_r
python3 bench/compare.py $OUT/online.json $OUT/twopass.json $OUT/twopass_r.json $OUT/online_r.json --impl flashcore 2>&1 | tail -8
python3 bench/compare.py $OUT/online_s4.json $OUT/twopass_s4.json $OUT/twopass_r_s4.json $OUT/online_r_s4.json --impl flashcore 2>&1 | tail -8
grep flashcore $OUT/online.log $OUT/twopass.log | head -12
