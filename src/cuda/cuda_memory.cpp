#include "cuda/cuda_memory.hpp"

#include <cuda_runtime.h>

#include "cuda/cuda_check.hpp"

namespace pope {

std::size_t cuda_memory_in_use() {
  std::size_t free_bytes = 0, total_bytes = 0;
  POPE_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return total_bytes - free_bytes;
}

}  // namespace pope
