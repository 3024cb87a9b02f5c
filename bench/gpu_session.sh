#!/usr/bin/env bash
# One GPU session on a machine without network: install carried wheels (.whl/), then run the
# GPU tests, compute-sanitizer on the kernels, the benchmarks and the demo. Logs go to $OUT.
# NVRTC_ENGINE_CACHE_DIR (default /tmp/nvrtc-engine-cache), BENCH_TIMEOUT, BENCH_TAIL and
# BENCH_CPUS tune the steps.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
. bench/wheels.sh
export PYTHONUNBUFFERED=1 NVRTC_ENGINE_CACHE_DIR=${NVRTC_ENGINE_CACHE_DIR:-/tmp/nvrtc-engine-cache}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
for step in "$@"; do
  case "$step" in
    tests)  # one pytest per GPU test file, so a crash in one does not hide the others
      for f in ${GPU_TESTS:-tests/test_gpu_*.py}; do
        timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider --timeout=200 "$f" \
          >> "$OUT/gpu_tests.log" 2>&1; echo "$f rc=$?"
      done
      grep -E "^(FAILED|ERROR)|passed|failed|Fatal|Error:" "$OUT/gpu_tests.log" | tail -40 ;;
    alltests) python3 -m pytest -q -p no:cacheprovider 2>&1 | tee "$OUT/all_tests.log" | tail -40 ;;
    sanitize)  # activation kernels (no torch), then the norm and cast families
      for tool in memcheck racecheck; do
        compute-sanitizer --tool $tool --error-exitcode 9 python3 bench/sanitize_kernels.py \
          > "$OUT/sanitize_$tool.log" 2>&1
        echo "activation $tool rc=$?"; tail -3 "$OUT/sanitize_$tool.log"
        # --report-api-errors no: cuda.bindings probes driver entry points that this
        # driver lacks (cuGetProcAddress answers "invalid argument"), which is not a fault
        compute-sanitizer --tool $tool --error-exitcode 9 --report-api-errors no \
          python3 bench/sanitize_families.py >> "$OUT/sanitize_$tool.log" 2>&1
        echo "norm+cast $tool rc=$?"; tail -3 "$OUT/sanitize_$tool.log"
      done ;;
    demo) python3 -m nvrtc_engine.cli demo 2>&1; echo "demo rc=$?" ;;
    sass)  # SASS of the default GELU kernels, for instruction counts
      python3 - <<'PY'
import os, nvrtc_engine as ne
for d in ("fp8", "bf16"):
    k = ne.get_kernel("gelu", dtype=d)
    open(f"/tmp/gelu_{d}.cubin", "wb").write(k.artifact.image)
PY
      for d in fp8 bf16; do cuobjdump -sass /tmp/gelu_$d.cubin; done > "$OUT/gelu.sass"; wc -l "$OUT/gelu.sass" ;;
    warmprofile)  # where a new process spends its first (disk-hit) get_kernel
      python3 -c "import nvrtc_engine as ne; ne.get_kernel('gelu', dtype='fp8', arch='sm_90')"
      python3 - <<'PY' 2>&1 | head -45
import cProfile, pstats, time
import nvrtc_engine as ne
pr = cProfile.Profile(); pr.enable(); t = time.perf_counter()
k = ne.get_kernel("gelu", dtype="fp8", arch="sm_90")
print("first get_kernel", (time.perf_counter() - t) * 1e3, "ms", k.origin); pr.disable()
pstats.Stats(pr).sort_stats("cumulative").print_stats(25)
PY
      ;;
    *.py*)  # script.py@--flag=value@--other: arguments after '@'
      script=${step%%@*}; args=""; [ "$script" != "$step" ] && args=${step#*@}
      # BENCH_CPUS: a CPU list (taskset) the script is confined to, e.g. 0-15 for a 16-CPU host
      ${BENCH_CPUS:+taskset -c $BENCH_CPUS} timeout ${BENCH_TIMEOUT:-500} python3 "bench/$script" ${args//@/ } 2>&1 \
        | tail -${BENCH_TAIL:-30} ;;
  esac
done
