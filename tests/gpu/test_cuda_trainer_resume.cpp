// Exact resume on the GPU: a run stopped with --stop-at and resumed reproduces the
// uninterrupted run's per-step losses and final weights bitwise (same GPU, same build). The
// model has head_dim 64, so the fused attention kernels and the CUDA-graph step are in play.
#include <gtest/gtest.h>

#include "cuda/cuda_device.hpp"
#include "pope/train.hpp"
#include "unit/trainer_fixture.hpp"

using namespace pope;

namespace {

class CudaTrainerResume : public pope::testing::TrainerRunTest {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
    TrainerRunTest::SetUp();
    config_.model.n_embd = 128;  // 2 heads of 64: the fused attention path
    config_.train.device = DeviceChoice::cuda;
  }
};

}  // namespace

TEST_F(CudaTrainerResume, StoppedAndResumedEqualsUninterruptedBitwise) { expect_resume_equals_uninterrupted(5); }
