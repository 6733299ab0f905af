// softplus_parts (kernels/attention/encoding_math.cuh) evaluated on given inputs, for
// test_cuda_softplus.cpp: PoPE's magnitudes checked on their own, over far more inputs than
// the attention tests reach.
#include "softplus_values.hpp"

#include "attention/encoding_math.cuh"

namespace pope::testing {

namespace {

__global__ void softplus_values_kernel(const float* x, int count, float* value, float* derivative) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= count) return;
  const kernels::ValueAndDerivative parts = kernels::softplus_parts(x[i]);
  value[i] = parts.value;
  derivative[i] = parts.derivative;
}

}  // namespace

cudaError_t softplus_values(const float* x, int count, float* value, float* derivative) {
  constexpr int kThreads = 256;
  if (count <= 0) return cudaErrorInvalidValue;
  softplus_values_kernel<<<(count + kThreads - 1) / kThreads, kThreads>>>(x, count, value, derivative);
  return cudaGetLastError();
}

}  // namespace pope::testing
