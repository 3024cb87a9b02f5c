#!/usr/bin/env bash
# Everything a GPU machine checks and measures, step by step, unattended:
#
#   bash bench/run_all.sh [STEP ...]      (no STEP: every step below, in this order)
#
#   step       what                                                       expected on the H200 host
#   tests      python3 -m pytest -m gpu -q -p no:benchmark (PYTEST_ARGS, default -n 8)   5 min
#   memcheck   compute-sanitizer memcheck over tests/tools/sanitize.py (SANITIZE_CASE)   3 min
#   racecheck  compute-sanitizer racecheck over the same                                 5 min
#   activation python3 bench/bandwidth.py --family activation                            6 min
#   norm       python3 bench/bandwidth.py --family norm                                  7 min
#   norm_paired python3 bench/norm_bandwidth.py --baseline $NORM_BASELINE (the norm kernels
#              against another copy's, e.g. git archive REV | tar -x -C DIR; named only)   2 min
#   cast       python3 bench/bandwidth.py --family cast --paired 15                      3 min
#   launch     python3 bench/launch_overhead.py                                          1 min
#   compile    python3 bench/compile_latency.py --tag h200-host                          1 min
#   prewarm    python3 bench/prewarm.py --tag 16cpu --repeat 5 (cold: fresh process+cache)  1 min
#   fanout     python3 bench/fanout.py                                                   3 min
#   torch      python3 bench/torch_block.py                                              4 min
#
# Wheels carried in .whl/ (the GPU host has no network and lacks diskcache, platformdirs,
# redis) are installed first into /tmp/site, once per set of wheels. Each step's output goes to
# $OUT/logs/STEP.log and its result JSON to bench/results/ and $OUT; $OUT/summary.txt lists
# each step's exit code and seconds. A step that fails does not stop the others. The whole run
# stays within BENCH_BUDGET seconds (default 570, for a 10-minute call): a step is skipped when
# its expected time no longer fits, and the running one is stopped when the budget is spent.
# Set BENCH_COMMIT to the commit measured where the checkout has no .git directory.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/bench-out}
mkdir -p "$OUT/logs"
: > "$OUT/summary.txt"
BUDGET=${BENCH_BUDGET:-570}
START=$(date +%s)
ALL="tests memcheck racecheck activation norm cast launch compile prewarm fanout torch"
declare -A EXPECTED=([tests]=300 [memcheck]=180 [racecheck]=300 [activation]=360 [norm]=420
  [norm_paired]=120 [cast]=180 [launch]=60 [compile]=60 [prewarm]=120 [fanout]=180 [torch]=240)

if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 0
fi
for step in "$@"; do
  [ -n "${EXPECTED[$step]:-}" ] || { echo "unknown step '$step'; steps: $ALL" >&2; exit 2; }
done

if ls .whl/*.whl > /dev/null 2>&1; then
  if [ "$(ls .whl)" != "$(cat /tmp/site/.wheels 2> /dev/null)" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl || echo "installing .whl/ failed" >&2
    ls .whl > /tmp/site/.wheels
  fi
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
# the compiled templates an install leaves in the package (see nvrtc_engine/core/render.py)
python3 -c "from nvrtc_engine.core.render import precompile; precompile()" ||
  echo "precompiling the templates failed" >&2
export PYTHONUNBUFFERED=1 NVRTC_ENGINE_CACHE_DIR=${NVRTC_ENGINE_CACHE_DIR:-/tmp/nvrtc-engine-cache}
export OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"

sanitize() {  # $1: the compute-sanitizer tool
  # --report-api-errors no: cuda.bindings probes driver entry points an older driver lacks
  compute-sanitizer --tool "$1" --error-exitcode 9 --report-api-errors no \
    python3 tests/tools/sanitize.py --case "${SANITIZE_CASE:-}"
}

run_step() {
  case "$1" in
    tests)  # -n 8 where pytest-xdist is installed
      python3 -c "import xdist" 2> /dev/null && default="-n 8" || default=""
      python3 -m pytest -m gpu -q -p no:benchmark -p no:cacheprovider \
        --continue-on-collection-errors ${PYTEST_ARGS:-$default} ;;
    memcheck | racecheck) sanitize "$1" ;;
    activation | norm) python3 bench/bandwidth.py --family "$1" ;;
    norm_paired) python3 bench/norm_bandwidth.py --rounds 10 --repeat 10 \
      --baseline "${NORM_BASELINE:?NORM_BASELINE: a directory holding the other copy}" ;;
    cast) python3 bench/bandwidth.py --family cast --paired 15 ;;
    launch) python3 bench/launch_overhead.py ;;
    compile) python3 bench/compile_latency.py --tag h200-host ;;
    prewarm) python3 bench/prewarm.py --tag 16cpu --repeat 5 ;;
    fanout) python3 bench/fanout.py ;;
    torch) python3 bench/torch_block.py ;;
  esac
}

for step in ${*:-$ALL}; do
  left=$((BUDGET - ($(date +%s) - START)))
  if [ "$left" -lt "${EXPECTED[$step]}" ]; then
    echo "$step skipped: expected ${EXPECTED[$step]} s, ${left} s of the budget left" \
      | tee -a "$OUT/summary.txt"
    continue
  fi
  echo "== $step (expected ${EXPECTED[$step]} s, ${left} s left)"
  t0=$(date +%s)
  # export -f: run_step and sanitize run in the shell timeout starts
  export -f run_step sanitize
  timeout -k 10 "$left" bash -c "run_step $step" > "$OUT/logs/$step.log" 2>&1
  rc=$?
  echo "$step rc=$rc $(($(date +%s) - t0)) s" | tee -a "$OUT/summary.txt"
  tail -n 15 "$OUT/logs/$step.log"
done
cat "$OUT/summary.txt"
