// Grow-only device memory for an op's temporary data (sort buffers, partial sums). It grows
// on the first call with a larger problem and is reused afterwards, so the steps of a
// training run (and a CUDA graph capturing one) allocate nothing.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "cuda/cuda_check.hpp"

namespace pope::cuda {

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
    return data_;
  }
  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace pope::cuda
