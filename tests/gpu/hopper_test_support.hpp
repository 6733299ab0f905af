// Whether a test of Hopper-only code (wgmma, TMA: sm_90 instructions) can run here.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "cuda/cuda_device.hpp"

namespace pope::test {

// Why a test of `feature` cannot run on this machine (no CUDA device, or device 0 is not sm_90),
// for GTEST_SKIP; empty when it can. Throws when device 0 cannot be queried (a failure, not a skip).
inline std::string why_not_hopper(const char* feature) {
  if (cuda_device_count() == 0) return "no CUDA device";
  cudaDeviceProp properties{};
  const cudaError_t status = cudaGetDeviceProperties(&properties, 0);
  if (status != cudaSuccess) throw std::runtime_error(std::string("cudaGetDeviceProperties: ") + cudaGetErrorString(status));
  if (properties.major == 9) return {};
  return std::string(feature) + " needs an sm_90 GPU, this is sm_" + std::to_string(properties.major) +
         std::to_string(properties.minor);
}

}  // namespace pope::test
