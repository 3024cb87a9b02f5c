// The host cost of cuLaunchKernel itself, from C++: the floor under any Python launch path.
// Built and run on the GPU host by bench/launch_overhead.py, or by hand:
//   nvcc -O2 -arch=sm_90 bench/launch_floor.cu -o launch_floor -lcuda && ./launch_floor
// Prints one JSON object: microseconds per launch (best of 5 runs of N launches, the GPU not
// waited on inside a run) for an empty kernel with 1 and with 7 parameters (the flat
// activation kernel's count), on the legacy default stream and on a non-blocking stream, for
// N = 5000 and N = 200: a run longer than the GPU's launch queue can end up timing the GPU's
// rate of retiring launches, not the host.
#include <cuda.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

__global__ void one(const void*) {}
__global__ void seven(const void*, void*, long long, const float*, float*, float*, int) {}

#define CHECK(call)                                                     \
  do {                                                                  \
    CUresult r_ = (call);                                               \
    if (r_ != CUDA_SUCCESS) {                                           \
      std::fprintf(stderr, "%s failed: %d\n", #call, static_cast<int>(r_)); \
      std::exit(1);                                                     \
    }                                                                   \
  } while (0)

static double per_launch_us(CUfunction f, void** params, CUstream s, int kLaunches) {
  double best = 1e30;
  for (int run = 0; run < 5; ++run) {
    CHECK(cuStreamSynchronize(s));
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kLaunches; ++i) CHECK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, params, nullptr));
    const auto t1 = std::chrono::steady_clock::now();
    const double us = std::chrono::duration<double, std::micro>(t1 - t0).count() / kLaunches;
    if (us < best) best = us;
  }
  CHECK(cuStreamSynchronize(s));
  return best;
}

int main() {
  cudaFree(nullptr);  // creates the primary context and makes it current
  cudaFunction_t f1, f7;
  cudaGetFuncBySymbol(&f1, reinterpret_cast<const void*>(one));
  cudaGetFuncBySymbol(&f7, reinterpret_cast<const void*>(seven));
  void* buf;
  cudaMalloc(&buf, 256);
  long long n = 1024;
  int aligned = 1;
  void* p = buf;
  float* fp = static_cast<float*>(buf);
  void* params1[] = {&p};
  void* params7[] = {&p, &p, &n, &fp, &fp, &fp, &aligned};
  CUstream nb;
  CHECK(cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING));
  // warm-up: first launches load the module lazily
  CUfunction k1 = reinterpret_cast<CUfunction>(f1), k7 = reinterpret_cast<CUfunction>(f7);
  per_launch_us(k1, params1, nullptr, 5000);
  per_launch_us(k7, params7, nb, 5000);
  std::printf("{");
  const int counts[] = {5000, 200};
  for (int c = 0; c < 2; ++c) {
    const int n = counts[c];
    std::printf(
        "%s\"one_param_legacy_stream_%d_us\": %.3f, \"seven_params_legacy_stream_%d_us\": %.3f, "
        "\"one_param_nonblocking_stream_%d_us\": %.3f, \"seven_params_nonblocking_stream_%d_us\": "
        "%.3f",
        c ? ", " : "", n, per_launch_us(k1, params1, nullptr, n), n,
        per_launch_us(k7, params7, nullptr, n), n, per_launch_us(k1, params1, nb, n), n,
        per_launch_us(k7, params7, nb, n));
  }
  std::printf("}\n");
  return 0;
}
