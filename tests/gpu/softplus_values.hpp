// Device entry of the softplus test (softplus_values.cu; see test_cuda_softplus.cpp).
#pragma once

#include <cuda_runtime.h>

namespace pope::testing {

// value[i], derivative[i] = kernels::softplus_parts(x[i]) for i < count (device pointers), on
// the default stream; returns the launch's error.
cudaError_t softplus_values(const float* x, int count, float* value, float* derivative);

}  // namespace pope::testing
