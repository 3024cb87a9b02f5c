#!/usr/bin/env bash
# The three family benchmarks with torch.compile and the GPU tests of the families, on a
# machine with two GPUs (the final call of 2026-11-30): GPU 0 runs bench/activation_bandwidth.py
# and bench/norm_bandwidth.py, GPU 1 the GPU tests (four files at once), then
# bench/cast_bandwidth.py and compute-sanitizer on the quantize kernels. Logs and results are
# packed into $OUT/r.tgz; the three JSON files are also copied to $OUT as each run ends.
. bench/wheels.sh; export PYTHONUNBUFFERED=1; R=/tmp/r; mkdir -p $R $OUT
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt; T0=$(date +%s)
st() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s"; }
(
  taskset -cp 16-31 $BASHPID >/dev/null; export CUDA_VISIBLE_DEVICES=1 NVRTC_ENGINE_CACHE_DIR=/tmp/ct
  ls tests/test_gpu_activation.py tests/test_gpu_cast.py tests/test_gpu_norm.py tests/test_gpu_gelu.py | xargs -P 4 -I{} sh -c \
    'f={}; k=""; [ "$f" = tests/test_gpu_norm.py ] && k="tuned or shared_sums or hidden_sizes or single_row or large_mean"; timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider "$f" ${k:+-k "$k"} > '"$R"'/$(basename {}).log 2>&1; echo "{} rc=$?"'
  st tests 0
  export NVRTC_ENGINE_CACHE_DIR=/tmp/c1
  timeout 180 python3 bench/cast_bandwidth.py > $R/cast_bandwidth.log 2>&1; st cast_bandwidth $?; cp bench/results/cast_bandwidth.json $OUT/ 2>/dev/null
  timeout 35 compute-sanitizer --tool memcheck --error-exitcode 9 --report-api-errors no python3 bench/sanitize_families.py --case quantize > $R/san_quantize.log 2>&1; st "sanitize quantize memcheck" $?
) > $R/gpu1.txt 2>&1 &
(
  taskset -cp 0-15 $BASHPID >/dev/null; export CUDA_VISIBLE_DEVICES=0 NVRTC_ENGINE_CACHE_DIR=/tmp/c0
  timeout 230 python3 bench/activation_bandwidth.py --compile-ops=gelu,swiglu,dgelu,dswiglu > $R/activation_bandwidth.log 2>&1; st activation_bandwidth $?; cp bench/results/activation_bandwidth.json $OUT/ 2>/dev/null
  timeout 220 python3 bench/norm_bandwidth.py --repeat 20 > $R/norm_bandwidth.log 2>&1; st norm_bandwidth $?; cp bench/results/norm_bandwidth.json $OUT/ 2>/dev/null
) > $R/gpu0.txt 2>&1
wait
cp bench/results/activation_bandwidth.json bench/results/norm_bandwidth.json bench/results/cast_bandwidth.json $R/ 2>/dev/null
tar czf $OUT/r.tgz -C /tmp r
cat $R/gpu0.txt $R/gpu1.txt
for f in $R/test_gpu_*.log; do echo "$(basename $f): $(tail -n 1 $f)"; done
tail -n 2 $R/san_quantize.log
