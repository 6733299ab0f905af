// Launching attention kernels that need more dynamic shared memory than the default 48 KiB.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>

namespace pope::kernels {

// Launches `kKernel` with `threads` threads and `shared_bytes` of dynamic shared memory. The
// kernel's limit is raised only when a launch needs more than before, so steady-state launches
// (and CUDA graph capture) make no extra API calls.
template <auto kKernel, class... Args>
cudaError_t launch_with_shared(dim3 grid, int threads, std::size_t shared_bytes, cudaStream_t stream, Args... args) {
  static std::atomic<std::size_t> shared_limit{0};
  if (shared_bytes > shared_limit.load()) {
    const cudaError_t status =
        cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared_bytes));
    if (status != cudaSuccess) return status;
    shared_limit.store(shared_bytes);
  }
  kKernel<<<grid, threads, shared_bytes, stream>>>(args...);
  return cudaGetLastError();
}

}  // namespace pope::kernels
