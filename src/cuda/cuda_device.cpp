#include "cuda/cuda_device.hpp"

#include <cuda_runtime.h>
#include <fmt/format.h>

namespace pope {

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device / no driver" error
    return 0;
  }
  return count;
}

std::string cuda_device_summary(int index) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, index) != cudaSuccess) return fmt::format("CUDA device {} (unreadable)", index);
  return fmt::format("{} (sm_{}{}, {} SMs, {:.1f} GiB)", prop.name, prop.major, prop.minor, prop.multiProcessorCount,
                     double(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
}

}  // namespace pope
