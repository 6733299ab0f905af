// Error checking for CUDA runtime calls and kernel launches on the host side. Every call's
// status is checked: a failure throws std::runtime_error naming the call, where it was made
// and CUDA's own description, instead of surfacing later as garbage or a crash.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace pope::cuda {

// Throws when `status` is not cudaSuccess; `what` says which call or kernel failed.
inline void check(cudaError_t status, const char* what, const char* file, int line) {
  if (status == cudaSuccess) return;
  throw std::runtime_error(std::string("CUDA error in ") + what + " (" + file + ":" + std::to_string(line) +
                           "): " + cudaGetErrorName(status) + ": " + cudaGetErrorString(status));
}

}  // namespace pope::cuda

// POPE_CUDA_CHECK(cudaMalloc(&p, n)); also for kernel launchers that return
// cudaGetLastError() right after the launch.
#define POPE_CUDA_CHECK(call) ::pope::cuda::check((call), #call, __FILE__, __LINE__)
