export PYTHONUNBUFFERED=1
mkdir -p ~/.triton && tar xzf .triton_cache.tgz -C ~/.triton
R=$OUT/r; mkdir -p $R
PYTHONPATH=$PWD timeout 60 python3 ab/norm_gemv.py 2>&1 | tee $R/norm_gemv.log | grep -v Warn
PYTHONPATH=$PWD timeout 60 ncu --clock-control none -k regex:_gemv_kernel -c 8 \
  --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy \
  python3 ab/norm_gemv.py once > $R/ncu.txt 2>&1; echo ncu rc=$?
grep -E "gemv_kernel|Duration|Memory Throughput|Stall|Warp Cycles Per Issued|Registers|Achieved Occupancy" $R/ncu.txt | head -60
tar czf $OUT/r.tgz -C $OUT r
