#!/usr/bin/env bash
# The whole GPU verification in one call, for a machine with two GPUs (one works too, slower):
# GPU 1 runs the GPU test files (four at a time) and compute-sanitizer while GPU 0 runs the
# benchmarks undisturbed; then the two-GPU test runs with both visible. Everything the
# session writes (logs, bench/results/*.json) is packed into $OUT/session.tar.gz, and the
# lines worth reading are in $OUT/summary.txt.
#   BENCHES: benchmark steps for gpu_session.sh on GPU 0 (default: the list below).
#   BENCHES1: benchmark steps for GPU 1 once its tests are done (default: none).
#   GPU_TESTS: the GPU test files (default: every tests/test_gpu_*.py); SANITIZE=0 skips
#   compute-sanitizer. WAIT1: seconds GPU 1 may run on after GPU 0 is done (default 60);
#   TWO_GPU=0 skips the two-GPU test.
set -u
OUT=${OUT:-/tmp/out}
LOGS=/tmp/session-logs
mkdir -p "$OUT" "$LOGS"
. bench/wheels.sh
export PYTHONUNBUFFERED=1
ngpu=$(nvidia-smi -L | wc -l)
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$LOGS/gpus.txt"
BENCHES=${BENCHES:-"gelu_bandwidth.py launch_overhead.py compile_latency.py@--tag=h200-host prewarm.py@--repeat=1 demo activation_bandwidth.py@--compile-ops=gelu,swiglu norm_bandwidth.py@--no-compile@--repeat=20 cast_bandwidth.py@--no-compile"}
LIMIT=${LIMIT:-420}  # seconds for each of the two halves (tests, benchmarks)

run_tests() {  # $1: the GPU the tests see
  export CUDA_VISIBLE_DEVICES=$1 NVRTC_ENGINE_CACHE_DIR=/tmp/cache-tests
  ls ${GPU_TESTS:-tests/test_gpu_*.py} | xargs -P 4 -I{} sh -c \
    'timeout 420 python3 -m pytest -m gpu -q -p no:cacheprovider {} > '"$LOGS"'/$(basename {}).log 2>&1; echo "{} rc=$?"'
  for f in "$LOGS"/test_gpu_*.log; do echo "$(basename "$f"): $(tail -1 "$f")"; done
  [ "${SANITIZE:-1}" = 1 ] && OUT=$LOGS bash bench/gpu_session.sh sanitize
  if [ -n "${BENCHES1:-}" ]; then
    # shellcheck disable=SC2086
    NVRTC_ENGINE_CACHE_DIR=/tmp/cache-bench1 BENCH_TIMEOUT=${BENCH_TIMEOUT:-170} \
      BENCH_TAIL=${BENCH_TAIL:-60} OUT=$LOGS bash bench/gpu_session.sh $BENCHES1 > "$LOGS/bench1.txt" 2>&1
  fi
}

if [ "$ngpu" -ge 2 ]; then
  ncpu=$(nproc)
  (
    # the tests off CPUs 0-15, which the benchmarks use
    [ "$ncpu" -gt 16 ] && taskset -cp "16-$((ncpu - 1))" $BASHPID > /dev/null
    run_tests 1
  ) > "$LOGS/gpu1.txt" 2>&1 &
  tests_pid=$!
fi
# shellcheck disable=SC2086
# the benchmarks see 16 CPUs (the prewarm targets are for a 16-CPU host), the tests the rest
CUDA_VISIBLE_DEVICES=0 NVRTC_ENGINE_CACHE_DIR=/tmp/cache-bench BENCH_TIMEOUT=${BENCH_TIMEOUT:-170} \
  BENCH_CPUS=${BENCH_CPUS:-0-15} \
  BENCH_TAIL=${BENCH_TAIL:-60} OUT=$LOGS timeout "$LIMIT" bash bench/gpu_session.sh $BENCHES \
  > "$LOGS/bench.txt" 2>&1
if [ "$ngpu" -ge 2 ]; then
  waited=0
  while kill -0 "$tests_pid" 2>/dev/null && [ "$waited" -lt "${WAIT1:-60}" ]; do sleep 5; waited=$((waited + 5)); done
  kill -- -"$tests_pid" 2>/dev/null; pkill -f "pytest -m gpu" 2>/dev/null; pkill -f compute-sanitizer
  wait "$tests_pid" 2>/dev/null
  if [ "${TWO_GPU:-1}" = 1 ]; then  # the two-GPU test: one kernel launched on both devices
    NVRTC_ENGINE_CACHE_DIR=/tmp/cache-tests timeout 120 python3 -m pytest -m gpu -q \
      -p no:cacheprovider tests/test_gpu_prewarm.py -rs > "$LOGS/two_gpu.txt" 2>&1
    echo "two-GPU prewarm tests rc=$?" >> "$LOGS/two_gpu.txt"
  fi
else
  run_tests 0 > "$LOGS/gpu1.txt" 2>&1
fi
cp bench/results/*.json "$LOGS/" 2>/dev/null
{
  cat "$LOGS/gpus.txt"
  echo "== tests and sanitizer"; cat "$LOGS/gpu1.txt"
  echo "== two GPUs"; tail -5 "$LOGS/two_gpu.txt" 2>/dev/null
  echo "== benchmarks"; grep -vE "^\s*$" "$LOGS/bench.txt" | tail -150
  [ -f "$LOGS/bench1.txt" ] && { echo "== benchmarks on GPU 1"; grep -vE "^\s*$" "$LOGS/bench1.txt" | tail -100; }
} > "$OUT/summary.txt"
tar -C "$LOGS" -czf "$OUT/session.tar.gz" .
tail -60 "$OUT/summary.txt"
