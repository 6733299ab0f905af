// Launching attention kernels that need more dynamic shared memory than the default 48 KiB.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <mutex>

namespace pope::kernels {

// Launches `kKernel` with `threads` threads and `shared_bytes` of dynamic shared memory. A
// kernel's shared-memory limit is an attribute of the device that was current when it was set,
// so the raised limit is remembered per device: one process may drive several GPUs (the NCCL
// tests run one rank per thread). The limit is raised only when a launch needs more than before,
// so steady-state launches (and CUDA graph capture) make no extra API calls beyond
// cudaGetDevice.
template <auto kKernel, class... Args>
cudaError_t launch_with_shared(dim3 grid, int threads, std::size_t shared_bytes, cudaStream_t stream, Args... args) {
  static std::array<std::atomic<std::size_t>, 64> shared_limit_per_device{};  // more GPUs than any node has
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  if (device < 0 || device >= int(shared_limit_per_device.size())) return cudaErrorInvalidDevice;
  std::atomic<std::size_t>& remembered = shared_limit_per_device[std::size_t(device)];
  if (shared_bytes > remembered.load()) {
    // Serialised so that a smaller limit set by one thread never undoes a larger one that another
    // thread's launch on the same device relies on.
    static std::mutex raising;
    const std::lock_guard<std::mutex> lock(raising);
    if (shared_bytes > remembered.load()) {
      status = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared_bytes));
      if (status != cudaSuccess) return status;
      remembered.store(shared_bytes);
    }
  }
  kKernel<<<grid, threads, shared_bytes, stream>>>(args...);
  return cudaGetLastError();
}

}  // namespace pope::kernels
