// Data-parallel training on the CPU: ranks are threads with a CPU backend each and a
// ThreadCommunicator between them. Two ranks follow one rank's run at the same global batch,
// keep identical weights, write the run directory once, resume on another number of ranks,
// stop together when one rank is asked to, and report ranks whose weights diverged.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <exception>
#include <fstream>
#include <functional>
#include <thread>

#include "pope/rng.hpp"
#include "pope/train.hpp"
#include "pope/train_step.hpp"
#include "thread_communicator.hpp"
#include "trainer_fixture.hpp"

using namespace pope;
using pope::testing::ThreadCommunicator;
using pope::testing::ThreadWorld;

namespace {

// step → loss of the "train" records in metrics.jsonl, and how many records there are.
std::map<long, double> train_losses(const std::filesystem::path& run_dir, int* records = nullptr) {
  std::map<long, double> losses;
  std::ifstream in(run_dir / "metrics.jsonl");
  int count = 0;
  for (std::string line; std::getline(in, line);) {
    const auto record = nlohmann::json::parse(line);
    if (record["event"] == "train") {
      losses[record["step"].get<long>()] = record["loss"].get<double>();
      ++count;
    }
  }
  if (records) *records = count;
  return losses;
}

// Runs body(rank, communicator) on `ranks` threads and rethrows the first exception.
void run_ranks(int ranks, const std::function<void(int, std::unique_ptr<Communicator>)>& body) {
  auto world = std::make_shared<ThreadWorld>(ranks);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        body(r, std::make_unique<ThreadCommunicator>(world, r));
      } catch (...) {
        errors[std::size_t(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

class DataParallelTest : public pope::testing::TrainerRunTest {
 protected:
  void SetUp() override {
    TrainerRunTest::SetUp();
    config_.train.micro_batch_size = 2;  // global batch 8: accumulation 4 on one rank, 2 on two
  }
  // Trains `run` on `ranks` threads; returns each rank's final weights.
  std::vector<std::vector<float>> train_on(int ranks, const std::string& run, const std::string& resume = "",
                                           long stop_at = 0) {
    std::vector<std::vector<float>> params(static_cast<std::size_t>(ranks));
    run_ranks(ranks, [&](int rank, std::unique_ptr<Communicator> communicator) {
      Trainer trainer(config_, options(run, resume, stop_at), make_backend(DeviceChoice::cpu, "float", 1),
                      std::move(communicator));
      trainer.train();
      params[std::size_t(rank)] = trainer.model().parameters_to_host();
    });
    return params;
  }
};

double max_abs_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - double(b[i])));
  return worst;
}

// Same sequences per step (see micro_batch_first_sample); only the order of the gradient
// sums differs, so the curves agree to float round-off.
void expect_same_curve(const std::map<long, double>& a, const std::map<long, double>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [step, loss] : a) {
    ASSERT_TRUE(b.count(step)) << "step " << step;
    EXPECT_NEAR(b.at(step), loss, 1e-4 * loss) << "step " << step;
  }
}

}  // namespace

TEST_F(DataParallelTest, TwoRanksFollowOneRankAtTheSameGlobalBatch) {
  const auto single = train_on(1, "single");
  const auto pair = train_on(2, "pair");
  EXPECT_EQ(pair[0], pair[1]) << "data-parallel ranks must hold bit-identical weights";
  EXPECT_LT(max_abs_difference(pair[0], single[0]), 1e-4);
  int records = 0;
  const auto pair_losses = train_losses(dir_ / "pair", &records);
  EXPECT_EQ(records, config_.train.steps) << "only rank 0 writes metrics";
  const auto single_losses = train_losses(dir_ / "single");
  EXPECT_LT(single_losses.rbegin()->second, single_losses.begin()->second - 0.5) << "the model learns";
  expect_same_curve(single_losses, pair_losses);
  EXPECT_TRUE(latest_checkpoint(dir_ / "pair").has_value());
}

// The sampler is a function of the global sample index, so a run continues on another
// number of ranks, seeing the same sequences at every step.
TEST_F(DataParallelTest, ResumesOnAnotherNumberOfRanks) {
  train_on(1, "single");
  train_on(2, "split", "", 5);
  EXPECT_EQ(latest_checkpoint(dir_ / "split")->filename(), "step_00000005");
  train_on(1, "split", "auto");
  expect_same_curve(train_losses(dir_ / "single"), train_losses(dir_ / "split"));
}

// ZeRO-1: the moments sharded over two ranks; the curve follows one rank's, the ranks keep
// identical weights, and the checkpoint (moments gathered to rank 0) resumes on one rank
// without sharding, continuing the same curve.
TEST_F(DataParallelTest, ZeroOneFollowsOneRankAndItsCheckpointResumesUnsharded) {
  train_on(1, "single");
  config_.train.zero_stage = 1;
  config_.train.checkpoint_every = 5;
  const auto pair = train_on(2, "zero", "", 7);
  EXPECT_EQ(pair[0], pair[1]) << "data-parallel ranks must hold bit-identical weights";
  ASSERT_EQ(latest_checkpoint(dir_ / "zero")->filename(), "step_00000007");
  std::ifstream log(dir_ / "zero" / "train.log");
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("gradients: reduced to their shard's rank in buckets of 25 MiB overlapped with the backward; optimizer "
                      "state"), std::string::npos) << text;
  EXPECT_NE(text.find("(ZeRO-1: 1/2 of"), std::string::npos) << text;
  config_.train.zero_stage = 0;  // not part of the config hash: the resume is allowed
  train_on(1, "zero", "auto");
  expect_same_curve(train_losses(dir_ / "single"), train_losses(dir_ / "zero"));
}

TEST_F(DataParallelTest, AGlobalBatchTheRanksCannotSplitIsAConfigError) {
  config_.train.batch_size = 6;  // 3 micro-batches of 2: not divisible over 2 ranks
  try {
    train_on(2, "odd");
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("world size (2)"), std::string::npos) << e.what();
  }
}

TEST_F(DataParallelTest, ASignalStopsEveryRankAtTheSameStepWithACheckpoint) {
  std::vector<long> steps(2);
  std::vector<StopReason> reasons(2);
  run_ranks(2, [&](int rank, std::unique_ptr<Communicator> communicator) {
    Trainer trainer(config_, options("run"), make_backend(DeviceChoice::cpu, "float", 1), std::move(communicator));
    // Both threads share the process's stop flag, so the test sets it from rank 0's thread
    // once training has been set up; the ranks agree on the stop through their votes.
    if (rank == 0) Trainer::request_stop(SIGTERM);
    const TrainingSummary summary = trainer.train();
    steps[std::size_t(rank)] = summary.steps_done;
    reasons[std::size_t(rank)] = summary.reason;
  });
  EXPECT_EQ(steps[0], steps[1]);
  EXPECT_LT(steps[0], config_.train.steps);
  EXPECT_EQ(reasons[0], StopReason::terminated);
  EXPECT_EQ(reasons[1], StopReason::terminated);
  const auto latest = latest_checkpoint(dir_ / "run");
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->filename(), fmt::format("step_{:08}", steps[0]));
}

// A stop vote of one rank reaches every rank with the same step's results.
TEST_F(DataParallelTest, StopVotesAreSummedOverRanks) {
  std::vector<int> votes(2);
  std::vector<double> losses(2);
  run_ranks(2, [&](int rank, std::unique_ptr<Communicator> communicator) {
    auto backend = make_backend(DeviceChoice::cpu, "float", 1);
    Model model(config_.model, *backend);
    model.initialize(1);
    AdamW adamw(model, config_.optim);
    const int T = config_.train.seq_len;
    TrainStep step(model, adamw, TrainStepShape{1, 2, T, 1.0 / (4.0 * T)}, true, communicator.get());
    Rng rng(std::uint64_t(rank) + 7);  // each rank its own tokens
    std::vector<std::int32_t> tokens, targets;
    for (int i = 0; i < 2 * T; ++i) {
      tokens.push_back(std::int32_t(rng.below(64)));
      targets.push_back(std::int32_t(rng.below(64)));
    }
    step.enqueue(tokens, targets, 1, 1e-3, rank == 0);
    const TrainStepResult result = step.result(1);
    votes[std::size_t(rank)] = result.stop_votes;
    losses[std::size_t(rank)] = result.loss_sum;
  });
  EXPECT_EQ(votes[0], 1);
  EXPECT_EQ(votes[1], 1);
  EXPECT_EQ(losses[0], losses[1]) << "the loss sum is reduced over the ranks";
}

TEST_F(DataParallelTest, RanksWhoseWeightsDivergedAreReported) {
  std::vector<std::string> errors(2);
  run_ranks(2, [&](int rank, std::unique_ptr<Communicator> communicator) {
    Trainer trainer(config_, options("run"), make_backend(DeviceChoice::cpu, "float", 1), std::move(communicator));
    if (rank == 1) trainer.model().parameters().as<float>()[0] += 0.5f;
    try {
      trainer.train();
    } catch (const CommunicatorError& e) {
      errors[std::size_t(rank)] = e.what();
    }
  });
  for (const std::string& error : errors)
    EXPECT_NE(error.find("the weights of rank 1 differ from rank 0's"), std::string::npos) << error;
  EXPECT_FALSE(latest_checkpoint(dir_ / "run").has_value()) << "no checkpoint of diverged ranks";
}
