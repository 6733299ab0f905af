// Grow-only device memory for an op's temporary data (sort buffers, partial sums). It grows
// on the first call with a larger problem and is reused afterwards, so the steps of a
// training run (and a CUDA graph capturing one) allocate nothing.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "cuda/cuda_check.hpp"

namespace pope::cuda {

// Counts every change of scratch memory that recorded work (a CUDA graph) could hold: a block
// moved by growing, or a table whose uploaded values changed (CudaBackend::scratch_generation).
inline std::atomic<std::uint64_t>& scratch_changes() {
  static std::atomic<std::uint64_t> changes{0};
  return changes;
}

class DeviceScratch {
 public:
  DeviceScratch() = default;
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;
  ~DeviceScratch() {
    if (data_) cudaFree(data_);
  }

  // At least `bytes` of device memory. Growing frees the old block; cudaFree waits for the
  // device to finish, so no queued kernel still uses it.
  void* reserve(std::size_t bytes) {
    if (bytes <= bytes_ && data_) return data_;
    if (data_) POPE_CUDA_CHECK(cudaFree(data_));
    data_ = nullptr;
    bytes_ = 0;
    POPE_CUDA_CHECK(cudaMalloc(&data_, bytes == 0 ? 1 : bytes));
    bytes_ = bytes;
    scratch_changes().fetch_add(1, std::memory_order_relaxed);
    return data_;
  }
  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace pope::cuda
