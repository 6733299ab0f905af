// Data-parallel training steps over NCCL on two GPUs (two ranks as threads of this process):
// the all-reduce overlapped with the backward in buckets gives the single all-reduce's
// weights bit for bit (with ZeRO-1, the reduce-scatter's), and ZeRO-1 (reduce-scatter,
// sharded AdamW, all-gather) gives the unsharded step's weights: bit for bit without
// clipping (the same fp32 sums and updates), within fp32 rounding with clipping (the norm is
// summed by shards). Reports SKIPPED (visibly) without two GPUs.
#ifdef POPE_HAVE_NCCL
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <vector>

#include "cuda/cuda_device.hpp"
#include "nccl_ranks.hpp"
#include "pope/rng.hpp"
#include "pope/train_step.hpp"
#include "unit/model_shape.hpp"

namespace {

using namespace pope;

ModelConfig small_model() {
  pope::testing::ModelShape shape = pope::testing::kGpuTestShape;
  shape.n_layer = 4;
  return pope::testing::model_config(shape, "pope");
}

struct Setting {
  std::int64_t bucket_bytes = 0;
  bool zero = false;
  double grad_clip = 0.0;
};

class NcclDataParallelStep : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() < 2) GTEST_SKIP() << "needs two CUDA devices (and NCCL)";
  }

  // Four steps on two ranks, each rank its own random tokens; returns each rank's weights.
  std::vector<std::vector<float>> train(const Setting& setting) {
    const auto rendezvous_path = std::filesystem::temp_directory_path() /
                                 ("pope_nccl_step_" + std::to_string(::getpid()) + "_" + std::to_string(++runs_));
    std::vector<std::vector<float>> weights(2);
    pope::testing::run_two_nccl_ranks(rendezvous_path, [&](int rank, Backend& backend, Communicator& communicator) {
      Model model(small_model(), backend, setting.zero ? 2 : 1);
      model.initialize(11);
      OptimConfig optim;
      optim.weight_decay = 0.1;
      optim.grad_clip = setting.grad_clip;
      AdamW adamw(model, optim, setting.zero ? &communicator : nullptr);
      const int B = 4, T = 128, micro = 2;
      TrainStep step(model, adamw, TrainStepShape{micro, B, T, 1.0 / (2 * micro * B * T)}, true, &communicator,
                     setting.bucket_bytes);
      for (long s = 1; s <= 4; ++s) {
        Rng rng(std::uint64_t(100 * s + rank));
        std::vector<std::int32_t> tokens(std::size_t(micro * B * T)), targets(tokens.size());
        for (auto& t : tokens) t = std::int32_t(rng.below(500));
        for (auto& t : targets) t = std::int32_t(rng.below(500));
        step.enqueue(tokens, targets, s, 1e-3);
      }
      EXPECT_TRUE(step.result(4).optimizer.applied);
      adamw.gather_master_weights();
      weights[std::size_t(rank)] = model.parameters_to_host();
      communicator.barrier();
    });
    EXPECT_EQ(weights[0], weights[1]) << "the ranks' weights differ";
    return weights;
  }

  int runs_ = 0;
};

TEST_F(NcclDataParallelStep, OverlappedBucketsEqualTheSingleAllReduceBitwise) {
  const auto single = train({0, false, 1.0});
  // 256 KiB buckets: several per backward (one layer is ≈ 3 MiB of fp32 gradients, merged
  // neighbours ≥ 256 KiB), and the default 25 MiB (the final norm and layers merged).
  EXPECT_EQ(train({256 << 10, false, 1.0})[0], single[0]);
  EXPECT_EQ(train({std::int64_t(25) << 20, false, 1.0})[0], single[0]);
}

// With ZeRO-1 the buckets go to their shard's owner (ncclReduce) instead of one reduce-scatter
// after the backward: the same two summands per element, so the same bits, clipping included.
TEST_F(NcclDataParallelStep, ZeroOneBucketsEqualTheReduceScatterBitwise) {
  const auto scattered = train({0, true, 1.0});
  EXPECT_EQ(train({256 << 10, true, 1.0})[0], scattered[0]);
  EXPECT_EQ(train({std::int64_t(25) << 20, true, 1.0})[0], scattered[0]);
}

TEST_F(NcclDataParallelStep, ZeroOneEqualsTheUnshardedStepBitwiseWithoutClipping) {
  EXPECT_EQ(train({0, true, 0.0})[0], train({0, false, 0.0})[0]);
}

// With clipping the two clip factors may differ in the last bits, and a bf16 compute copy
// that then rounds the other way changes later gradients a little (an Adam update of a
// near-zero gradient may even change sign), so the check is statistical: the weights differ
// by far less than the training moved them (a wrong shard, a lost weight decay at a shard
// edge or a wrong norm would differ by about as much).
TEST_F(NcclDataParallelStep, ZeroOneFollowsTheUnshardedStepWithinRoundingWithClipping) {
  const auto sharded = train({0, true, 0.5})[0];
  const auto unsharded = train({std::int64_t(25) << 20, false, 0.5})[0];
  auto cpu = make_backend(DeviceChoice::cpu, "float", 0);
  Model initial(small_model(), *cpu);
  initial.initialize(11);
  const std::vector<float> start = initial.parameters_to_host();
  ASSERT_EQ(sharded.size(), unsharded.size());
  ASSERT_EQ(start.size(), unsharded.size());
  double difference = 0.0, movement = 0.0;
  for (std::size_t i = 0; i < sharded.size(); ++i) {
    difference += std::abs(double(sharded[i]) - double(unsharded[i]));
    movement += std::abs(double(unsharded[i]) - double(start[i]));
  }
  EXPECT_GT(movement, 0.0);
  EXPECT_LT(difference, 1e-2 * movement) << "mean difference " << difference / double(sharded.size())
                                         << ", mean movement " << movement / double(sharded.size());
}

}  // namespace
#endif  // POPE_HAVE_NCCL
