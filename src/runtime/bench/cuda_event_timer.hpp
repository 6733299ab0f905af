// CUDA timing shared by the pope-bench modes that time kernels directly (attention, matmul):
// device arrays freed on scope exit, and event pairs around interleaved phases.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <random>
#include <stdexcept>
#include <vector>

#include "cuda/cuda_check.hpp"
#include "pope/tensor.hpp"
#include "runtime/bench/bench_median.hpp"

namespace pope::bench {

class DeviceArray {
 public:
  explicit DeviceArray(std::size_t bytes) { POPE_CUDA_CHECK(cudaMalloc(&data_, bytes)); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { cudaFree(data_); }
  Tensor tensor(DType dtype, Shape shape) const { return Tensor{data_, dtype, DeviceKind::cuda, std::move(shape)}; }
  void* get() const { return data_; }

 private:
  void* data_ = nullptr;
};

inline void upload_random_bf16(const Tensor& t, float low, float high, std::mt19937& engine) {
  std::uniform_real_distribution<float> uniform(low, high);
  std::vector<__nv_bfloat16> host(static_cast<std::size_t>(t.numel()));
  for (auto& x : host) x = __float2bfloat16(uniform(engine));
  POPE_CUDA_CHECK(cudaMemcpy(t.data, host.data(), host.size() * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
}

// Event pairs around queued calls of several phases, interleaved call by call (phase 0, 1, …,
// then again), so that a drift of the GPU's clocks during a run (power capping, heat) falls on
// every phase alike; measured one phase after another, whichever came last read up to 10% slower.
// Medians in milliseconds once the stream has drained.
class InterleavedTimer {
 public:
  InterleavedTimer(int repeats, int phases)
      : repeats_(std::size_t(repeats)), starts_(repeats_ * phases), stops_(repeats_ * phases) {
    for (std::size_t i = 0; i < starts_.size(); ++i) {
      POPE_CUDA_CHECK(cudaEventCreate(&starts_[i]));
      POPE_CUDA_CHECK(cudaEventCreate(&stops_[i]));
    }
  }
  InterleavedTimer(const InterleavedTimer&) = delete;
  InterleavedTimer& operator=(const InterleavedTimer&) = delete;
  ~InterleavedTimer() {
    for (std::size_t i = 0; i < starts_.size(); ++i) {
      cudaEventDestroy(starts_[i]);
      cudaEventDestroy(stops_[i]);
    }
  }
  // One median per phase; `phases` has the size given to the constructor.
  std::vector<double> medians_ms(const std::vector<std::function<void()>>& phases) {
    const std::size_t count = phases.size();
    if (count * repeats_ != starts_.size()) throw std::logic_error("InterleavedTimer: wrong number of phases");
    for (std::size_t i = 0; i < repeats_; ++i)
      for (std::size_t p = 0; p < count; ++p) {
        POPE_CUDA_CHECK(cudaEventRecord(starts_[p * repeats_ + i], nullptr));
        phases[p]();
        POPE_CUDA_CHECK(cudaEventRecord(stops_[p * repeats_ + i], nullptr));
      }
    POPE_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<double> medians;
    for (std::size_t p = 0; p < count; ++p) {
      std::vector<double> ms(repeats_);
      for (std::size_t i = 0; i < repeats_; ++i) {
        float elapsed = 0.0f;
        POPE_CUDA_CHECK(cudaEventElapsedTime(&elapsed, starts_[p * repeats_ + i], stops_[p * repeats_ + i]));
        ms[i] = elapsed;
      }
      medians.push_back(median(ms));
    }
    return medians;
  }

 private:
  std::size_t repeats_;
  std::vector<cudaEvent_t> starts_, stops_;
};

}  // namespace pope::bench
