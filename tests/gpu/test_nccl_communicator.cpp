// The NCCL communicator on real GPUs: a one-rank communicator (any GPU machine) reduces to
// itself, waits and shuts down; two ranks on two GPUs (threads of this process) sum their
// buffers; a rank whose peer never joins stops with an error naming itself within the
// timeout instead of hanging. Reports SKIPPED (visibly) without a GPU or with one GPU for
// the two-rank test.
#ifdef POPE_HAVE_NCCL
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <vector>

#include "cuda/cuda_backend.hpp"
#include "cuda/cuda_device.hpp"
#include "cuda/nccl_communicator.hpp"
#include "nccl_ranks.hpp"

namespace {

using namespace pope;
using Seconds = std::chrono::duration<double>;

class NcclCommunicatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
    rendezvous_path_ = std::filesystem::temp_directory_path() /
                       ("pope_nccl_rdzv_" + std::to_string(::getpid()) + "_" +
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove(rendezvous_path_);
  }
  void TearDown() override { std::filesystem::remove(rendezvous_path_); }
  std::filesystem::path rendezvous_path_;
};

// Sums `values` over the ranks of `communicator` and returns the result.
std::vector<double> reduce(Backend& backend, Communicator& communicator, const std::vector<double>& values) {
  const OwnedTensor buffer = allocate_tensor(backend, {std::int64_t(values.size())}, DType::f64);
  backend.copy_from_host(buffer.tensor, values.data());
  communicator.all_reduce_sum(buffer.tensor);
  const auto done = backend.make_fence();
  done->record();
  communicator.wait(*done);
  std::vector<double> result(values.size());
  backend.copy_to_host(result.data(), buffer.tensor);
  return result;
}

TEST_F(NcclCommunicatorTest, OneRankReducesToItselfAndCleansUp) {
  const World world{0, 1, 0, Launcher::environment};
  auto backend = make_cuda_backend(0);
  FileRendezvous rendezvous(rendezvous_path_, world, Seconds(60));
  auto communicator = make_nccl_communicator(world, *backend, rendezvous, Seconds(60));
  EXPECT_FALSE(std::filesystem::exists(rendezvous_path_)) << "rank 0 removes the rendezvous file once connected";
  const std::vector<double> values{1.5, -2.0, 1e300};
  EXPECT_EQ(reduce(*backend, *communicator, values), values);
  const OwnedTensor f32 = allocate_tensor(*backend, {1000}, DType::f32);
  std::vector<float> ones(1000, 1.0f);
  tensor_from_host_f32(*backend, f32.tensor, ones);
  communicator->all_reduce_sum(f32.tensor);
  communicator->barrier();
  EXPECT_EQ(tensor_to_host_f32(*backend, f32.tensor), ones);
  EXPECT_THROW(communicator->all_reduce_sum(allocate_tensor(*backend, {4}, DType::bf16).tensor),
               std::invalid_argument);
}

TEST_F(NcclCommunicatorTest, TwoRanksOnTwoGpusSumTheirBuffers) {
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs two CUDA devices";
  std::vector<std::vector<double>> results(2);
  pope::testing::run_two_nccl_ranks(rendezvous_path_, [&](int rank, Backend& backend, Communicator& communicator) {
    std::vector<double> values(4097);
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = double(i) * (rank + 1);
    results[std::size_t(rank)] = reduce(backend, communicator, values);
    communicator.barrier();
  });
  ASSERT_EQ(results[0], results[1]);
  for (std::size_t i = 0; i < results[0].size(); ++i) ASSERT_EQ(results[0][i], 3.0 * double(i)) << i;
}

// ZeRO-1's copies: the bf16 all-gather of the compute copy and the grouped broadcast of fp32
// pieces from their owners (a piece from each rank, of odd sizes).
TEST_F(NcclCommunicatorTest, TwoRanksGatherBf16AndBroadcastPiecesFromTheirOwners) {
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs two CUDA devices";
  std::vector<std::vector<float>> gathered(2), broadcast(2);
  pope::testing::run_two_nccl_ranks(rendezvous_path_, [&](int rank, Backend& backend, Communicator& communicator) {
    // Integers below 256 are exact in bf16; rank r fills its own shard with r·128 + i mod 64.
    const std::int64_t n = 2 * 777;
    std::vector<float> values(std::size_t(n), -1.0f);
    for (std::int64_t i = rank * n / 2; i < (rank + 1) * n / 2; ++i) values[std::size_t(i)] = float(rank * 128 + i % 64);
    const OwnedTensor bf16 = allocate_tensor(backend, {n}, DType::bf16), staging = allocate_tensor(backend, {n}, DType::f32);
    tensor_from_host_f32(backend, staging.tensor, values);
    backend.convert(bf16.tensor, staging.tensor);
    communicator.all_gather(bf16.tensor);
    // fp32 buffer: piece [0, 5) from rank 1, piece [5, 301) from rank 0; every rank starts
    // from its own values.
    std::vector<float> mine(301);
    for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = float(rank) + 0.25f * float(i);
    const OwnedTensor f32 = allocate_tensor(backend, {301}, DType::f32);
    tensor_from_host_f32(backend, f32.tensor, mine);
    const std::vector<BroadcastPiece> pieces{{f32.tensor.rows(0, 5), 1}, {f32.tensor.rows(5, 301), 0}};
    communicator.broadcast(pieces);
    communicator.barrier();
    gathered[std::size_t(rank)] = tensor_to_host_f32(backend, bf16.tensor);
    broadcast[std::size_t(rank)] = tensor_to_host_f32(backend, f32.tensor);
  });
  for (int rank = 0; rank < 2; ++rank) {
    for (std::size_t i = 0; i < gathered[std::size_t(rank)].size(); ++i) {
      const std::size_t owner = i < gathered[0].size() / 2 ? 0 : 1;
      ASSERT_EQ(gathered[std::size_t(rank)][i], float(owner * 128 + i % 64)) << "rank " << rank << ", element " << i;
    }
    for (std::size_t i = 0; i < broadcast[std::size_t(rank)].size(); ++i)
      ASSERT_EQ(broadcast[std::size_t(rank)][i], float(i < 5 ? 1 : 0) + 0.25f * float(i))
          << "rank " << rank << ", element " << i;
  }
}

TEST_F(NcclCommunicatorTest, ARankWhosePeerNeverJoinsTimesOutNamingItself) {
  const World world{0, 2, 0, Launcher::environment};  // rank 1 never starts
  auto backend = make_cuda_backend(0);
  FileRendezvous rendezvous(rendezvous_path_, world, Seconds(2));
  const auto start = std::chrono::steady_clock::now();
  try {
    make_nccl_communicator(world, *backend, rendezvous, Seconds(2));
    FAIL() << "expected CommunicatorError";
  } catch (const CommunicatorError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("rank 0 of 2"), std::string::npos) << message;
    EXPECT_NE(message.find("POPE_NCCL_TIMEOUT_S"), std::string::npos) << message;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

}  // namespace
#endif  // POPE_HAVE_NCCL
