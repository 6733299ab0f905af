// GPU smoke test: device discovery and one kernel round trip. Reports SKIPPED (visibly)
// on machines without a GPU, e.g. CI.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "cuda/cuda_device.hpp"
#include "fill.cuh"

namespace {

// Skipping in SetUp skips the whole test body.
class CudaSmoke : public ::testing::Test {
 protected:
  void SetUp() override {
    if (pope::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  }
};

TEST_F(CudaSmoke, DeviceIsDescribed) {
  const std::string summary = pope::cuda_device_summary(0);
  EXPECT_NE(summary.find("sm_"), std::string::npos) << summary;
}

TEST_F(CudaSmoke, FillKernelWritesEveryElement) {
  const std::size_t n = (1u << 20) + 37;  // not a multiple of the block size
  float* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemset(device, 0xFF, n * sizeof(float)), cudaSuccess);  // poison: NaN pattern
  ASSERT_EQ(pope::kernels::fill_f32(device, n, 1.5f, nullptr), cudaSuccess);
  std::vector<float> host(n);
  ASSERT_EQ(cudaMemcpy(host.data(), device, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(device);
  std::size_t wrong = 0;
  for (float x : host) wrong += x != 1.5f;
  EXPECT_EQ(wrong, 0u);
}

}  // namespace
