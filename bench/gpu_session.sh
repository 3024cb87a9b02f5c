#!/usr/bin/env bash
# One GPU session on a machine without network: install carried wheels (.whl/), then run the
# GPU tests, compute-sanitizer on the kernels, the benchmarks and the demo. Logs go to $OUT.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 NVRTC_ENGINE_CACHE_DIR=/tmp/nvrtc-engine-cache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
for step in "$@"; do
  case "$step" in
    tests) python3 -m pytest -m gpu -q -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" | tail -40 ;;
    alltests) python3 -m pytest -q -p no:cacheprovider 2>&1 | tee "$OUT/all_tests.log" | tail -40 ;;
    sanitize)
      compute-sanitizer --tool memcheck --error-exitcode 9 python3 bench/sanitize_kernels.py 2>&1 | tail -5
      echo "memcheck rc=${PIPESTATUS[0]}"
      compute-sanitizer --tool racecheck --error-exitcode 9 python3 bench/sanitize_kernels.py 2>&1 | tail -5
      echo "racecheck rc=${PIPESTATUS[0]}" ;;
    demo) python3 -m nvrtc_engine.cli demo 2>&1 | tee "$OUT/demo.txt"; echo "demo rc=${PIPESTATUS[0]}" ;;
    *.py) python3 "bench/$step" 2>&1 | tee "$OUT/${step%.py}.txt" | tail -40 ;;
  esac
done
