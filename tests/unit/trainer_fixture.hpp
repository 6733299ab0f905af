// A tiny, learnable token corpus and config for trainer tests (CPU, seconds).
#pragma once

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "pope/config.hpp"
#include "pope/data.hpp"
#include "pope/train.hpp"

#include "model_shape.hpp"

namespace pope::testing {

// Tokens that mostly follow t → (5t + 3) mod vocab, with 10% noise: a model can learn it.
inline std::vector<std::uint16_t> patterned_tokens(std::size_t count, int vocab, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint16_t> tokens(count);
  std::uint16_t t = 1;
  for (auto& x : tokens) {
    t = rng() % 10 == 0 ? std::uint16_t(rng() % unsigned(vocab)) : std::uint16_t((5 * t + 3) % vocab);
    x = t;
  }
  return tokens;
}

// Writes train/val files under `dir` and returns a config that trains on them.
inline RunConfig tiny_run_config(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  write_llmc_shard(dir / "train.bin", patterned_tokens(20000, 64, 1));
  write_llmc_shard(dir / "val.bin", patterned_tokens(4000, 64, 2));
  RunConfig c;
  c.model = model_config({.n_embd = 32, .context_length = 32}, "pope");
  c.data.train = (dir / "train.bin").string();
  c.data.val = (dir / "val.bin").string();
  c.optim.lr = 3e-3;
  c.optim.min_lr = 3e-4;
  c.optim.warmup_steps = 2;
  c.train.steps = 12;
  c.train.batch_size = 8;
  c.train.micro_batch_size = 4;
  c.train.seq_len = 32;
  c.train.log_every = 1;
  c.train.eval_every = 0;
  c.train.eval_batches = 2;
  c.train.checkpoint_every = 0;
  c.train.device = DeviceChoice::cpu;
  c.train.threads = 1;
  return c;
}

// step → loss of the "train" records in metrics.jsonl.
inline std::map<long, double> train_losses(const std::filesystem::path& run_dir) {
  std::map<long, double> losses;
  std::ifstream in(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto record = nlohmann::json::parse(line);
    if (record["event"] == "train") losses[record["step"].get<long>()] = record["loss"].get<double>();
  }
  return losses;
}

inline std::filesystem::path fresh_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("pope_test_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  return dir;
}

// A run directory per test (named after it) holding tiny_run_config's data; clears stop
// requests before and after, removes the directory after.
class TrainerRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Trainer::request_stop(0);
    // Parameterised tests are named "Test/param": one directory level all the same.
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(name.begin(), name.end(), '/', '_');
    dir_ = fresh_dir(name);
    config_ = tiny_run_config(dir_ / "data");
  }
  void TearDown() override {
    Trainer::request_stop(0);
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  TrainerOptions options(const std::string& run, const std::string& resume = "", long stop_at = 0) const {
    return TrainerOptions{dir_ / run, resume, true, stop_at, {}};
  }
  // A run stopped at `stop_at` and resumed with --resume auto equals the uninterrupted run:
  // the same per-step losses and bitwise the same final weights.
  void expect_resume_equals_uninterrupted(long stop_at) const {
    std::vector<float> straight_params;
    {
      Trainer straight(config_, options("straight"));
      straight.train();
      straight_params = straight.model().parameters_to_host();
    }
    {
      Trainer first(config_, options("split", "", stop_at));
      EXPECT_EQ(first.train().reason, StopReason::stop_at_step);
      EXPECT_EQ(first.step(), stop_at);
    }
    Trainer second(config_, options("split", "auto"));
    EXPECT_EQ(second.step(), stop_at);
    EXPECT_EQ(second.train().reason, StopReason::finished);
    const auto straight_losses = train_losses(dir_ / "straight");
    EXPECT_EQ(long(straight_losses.size()), config_.train.steps);
    EXPECT_EQ(train_losses(dir_ / "split"), straight_losses);
    EXPECT_EQ(second.model().parameters_to_host(), straight_params);
  }

  std::filesystem::path dir_;
  RunConfig config_;
};

}  // namespace pope::testing
