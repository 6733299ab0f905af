// The training loop: exact resume, stop requests, the non-finite guard, run-directory safety,
// phase timing in the log records, PoPE δ's bounds at each validation.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <numbers>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "pope/train.hpp"
#include "runtime/delta_bounds.hpp"
#include "scratch_dir.hpp"
#include "trainer_fixture.hpp"

using namespace pope;
using pope::testing::train_losses;

namespace {

using TrainerTest = pope::testing::TrainerRunTest;

}  // namespace

TEST_F(TrainerTest, ValidationLossFalls) {
  config_.train.steps = 30;
  Trainer trainer(config_, options("run"));
  const double before = trainer.evaluate();
  const TrainingSummary summary = trainer.train();
  ASSERT_TRUE(summary.last_val_loss.has_value());
  EXPECT_LT(*summary.last_val_loss, before - 0.5) << "before " << before;
  EXPECT_EQ(summary.steps_done, 30);
  EXPECT_TRUE(std::filesystem::exists(summary.last_checkpoint / "model.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(dir_ / "run" / "config.json"));
}

TEST_F(TrainerTest, ResumeReproducesTheUninterruptedRunExactly) { expect_resume_equals_uninterrupted(5); }

TEST(DeltaBoundShares, CountEntriesOnAndPastTheBoundsInF32) {
  const float lowest = float(-2.0 * std::numbers::pi);
  const std::vector<float> delta{0.0f, lowest, 0.5f, -7.0f, -1.0f, std::nextafter(lowest, 0.0f), 1e-30f, -3.0f};
  const DeltaBoundShares shares = delta_bound_shares(delta);
  EXPECT_EQ(shares.entries, 8);
  EXPECT_DOUBLE_EQ(shares.at_bound, 2.0 / 8);
  EXPECT_DOUBLE_EQ(shares.outside, 3.0 / 8);
}

// Each validation of a PoPE run logs the shares of δ on and past [−2π, 0]: at step 0 every δ is
// on the bound 0; under the clamp, first steps that push δ above 0 leave it there (no gradient).
TEST_F(TrainerTest, ValidationsLogTheShareOfPopeDeltaOnAndPastItsBounds) {
  config_.train.steps = 6;
  config_.train.eval_every = 3;
  Trainer trainer(config_, options("run"));
  trainer.train();
  const std::optional<DeltaBoundShares> final_shares = delta_bound_shares(trainer.model());
  ASSERT_TRUE(final_shares.has_value());
  EXPECT_EQ(final_shares->entries, std::int64_t(config_.model.n_layer) * config_.model.n_embd);
  EXPECT_GT(final_shares->outside, 0.0);
  std::map<long, nlohmann::json> evals;
  std::ifstream in(dir_ / "run" / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto record = nlohmann::json::parse(line);
    if (record["event"] == "eval") evals[record["step"].get<long>()] = record;
  }
  ASSERT_EQ(evals.size(), 3u);
  EXPECT_EQ(evals[0]["delta_at_bound"], 1.0);
  EXPECT_EQ(evals[0]["delta_outside"], 0.0);
  EXPECT_EQ(evals[6]["delta_at_bound"], final_shares->at_bound);
  EXPECT_EQ(evals[6]["delta_outside"], final_shares->outside);
  std::ifstream log(dir_ / "run" / "train.log");
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("step 6 | PoPE δ: "), std::string::npos) << text;

  config_.model.position.kind = "rope";
  Trainer rope(config_, options("rope"));
  rope.train();
  EXPECT_FALSE(delta_bound_shares(rope.model()).has_value());
  std::ifstream rope_metrics(dir_ / "rope" / "metrics.jsonl");
  for (std::string line; std::getline(rope_metrics, line);) EXPECT_EQ(line.find("delta_"), std::string::npos) << line;
}

// Under delta_bound project the same steps leave no δ past [−2π, 0]: the entries that the clamp's
// run above carries past 0 sit on it.
TEST_F(TrainerTest, ProjectedPopeDeltaEndsOnOrInsideItsBounds) {
  config_.train.steps = 6;
  config_.model.position.pope.delta_bound = DeltaBound::project;
  Trainer trainer(config_, options("run"));
  trainer.train();
  const std::optional<DeltaBoundShares> shares = delta_bound_shares(trainer.model());
  ASSERT_TRUE(shares.has_value());
  EXPECT_EQ(shares->outside, 0.0);
  EXPECT_GT(shares->at_bound, 0.0);
  EXPECT_LT(shares->at_bound, 1.0);
}

// With train.phase_timing every "train" record carries the window's mean milliseconds per phase
// (a single CPU rank: no reduction or gather to wait for), and the losses are those of an
// untimed run.
TEST_F(TrainerTest, PhaseTimingLogsMillisecondsPerPhaseWithoutChangingTheRun) {
  config_.train.steps = 4;
  Trainer(config_, options("plain")).train();
  config_.train.phase_timing = true;
  Trainer(config_, options("timed")).train();
  EXPECT_EQ(train_losses(dir_ / "timed"), train_losses(dir_ / "plain"));
  std::ifstream in(dir_ / "timed" / "metrics.jsonl");
  int timed_records = 0;
  for (std::string line; std::getline(in, line);) {
    const auto record = nlohmann::json::parse(line);
    if (record["event"] != "train") continue;
    ASSERT_TRUE(record.contains("phase_ms")) << line;
    const auto& phases = record["phase_ms"];
    EXPECT_GT(phases["forward_backward"].get<double>(), 0.0) << line;
    EXPECT_GT(phases["update"].get<double>(), 0.0) << line;
    EXPECT_GE(phases["reduction"].get<double>(), 0.0) << line;
    EXPECT_GE(phases["gather"].get<double>(), 0.0) << line;
    ++timed_records;
  }
  EXPECT_EQ(timed_records, 4);
  std::ifstream plain(dir_ / "plain" / "metrics.jsonl");
  const std::string text((std::istreambuf_iterator<char>(plain)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text.find("phase_ms"), std::string::npos);
}

TEST_F(TrainerTest, StopRequestCheckpointsAndReportsTheSignal) {
  Trainer trainer(config_, options("run"));
  Trainer::request_stop(SIGTERM);
  const TrainingSummary summary = trainer.train();
  EXPECT_EQ(summary.reason, StopReason::terminated);
  EXPECT_EQ(summary.steps_done, 0);
  EXPECT_EQ(latest_checkpoint(dir_ / "run"), summary.last_checkpoint);
}

TEST_F(TrainerTest, NonFiniteStepsAreSkippedThenAbortKeepingTheLastGoodCheckpoint) {
  config_.train.max_nonfinite_steps = 3;
  {
    Trainer good(config_, options("run", "", 4));
    good.train();
  }
  {  // destroyed before `again`: a Trainer holds its run directory's lock while it exists
    Trainer trainer(config_, options("run", "auto"));
    float* params = trainer.model().parameters().as<float>();
    params[trainer.model().layout().offset(trainer.model().layout().index_of("final_norm.weight"))] =
        std::numeric_limits<float>::quiet_NaN();
    try {
      trainer.train();
      FAIL() << "expected TrainingAborted";
    } catch (const TrainingAborted& e) {
      EXPECT_NE(std::string(e.what()).find("3 consecutive"), std::string::npos) << e.what();
    }
  }
  const auto latest = latest_checkpoint(dir_ / "run");
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->filename(), "step_00000004");
  Trainer again(config_, options("run", "auto"));  // the kept checkpoint still loads
  EXPECT_EQ(again.step(), 4);
}

TEST_F(TrainerTest, RefusesToOverwriteARunWithoutResume) {
  {
    Trainer first(config_, options("run", "", 2));
    first.train();
  }
  EXPECT_THROW(Trainer(config_, options("run")), ConfigError);
}

// A resume with nothing left to do (the run is past --stop-at) takes no step, rewrites no
// checkpoint and reports no training loss (it printed "final train loss 0.0000").
TEST_F(TrainerTest, ResumeWithNothingToDoTakesNoStepAndWritesNothing) {
  {
    Trainer first(config_, options("run", "", 3));
    ASSERT_TRUE(first.train().last_train_loss.has_value());
  }
  const auto checkpoint = latest_checkpoint(dir_ / "run");
  ASSERT_TRUE(checkpoint.has_value());
  const auto written = std::filesystem::last_write_time(*checkpoint / "model.safetensors");
  Trainer again(config_, options("run", "auto", 2));
  const TrainingSummary summary = again.train();
  EXPECT_EQ(summary.steps_done, 3);
  EXPECT_FALSE(summary.last_train_loss.has_value());
  EXPECT_EQ(summary.last_checkpoint, *checkpoint);
  EXPECT_EQ(std::filesystem::last_write_time(*checkpoint / "model.safetensors"), written);
}

TEST_F(TrainerTest, ResumeWithADifferentConfigIsAnError) {
  {
    Trainer first(config_, options("run", "", 2));
    first.train();
  }
  const double lr = config_.optim.lr;
  config_.optim.lr *= 2;
  try {
    Trainer second(config_, options("run", "auto"));
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("different config"), std::string::npos) << message;
    // The key that changed, with the run's value and this config's, read from the run's config.json.
    EXPECT_NE(message.find("optim.lr = " + nlohmann::json(lr).dump() + ", this config says " +
                           nlohmann::json(lr * 2).dump()),
              std::string::npos)
        << message;
  }
  config_.optim.lr /= 2;
  config_.train.steps = 20;  // the number of steps may change on resume
  Trainer third(config_, options("run", "auto"));
  EXPECT_EQ(third.step(), 2);
}

// A changed architecture key is reported as the config key it is, before any tensor is read
// (it was "model.safetensors has tensors the model does not have").
TEST_F(TrainerTest, ResumeWithAnotherPositionKindNamesTheKey) {
  Trainer(config_, options("run", "", 2)).train();
  config_.model.position.kind = "rope";
  const std::string message = pope::testing::thrown_message<ConfigError>([&] { Trainer(config_, options("run", "auto")); });
  EXPECT_NE(message.find("was trained with a different config (model.position.kind = \"pope\", this config says "
                         "\"rope\")"),
            std::string::npos)
      << message;
  EXPECT_EQ(message.find("tensor"), std::string::npos) << message;
}

// δ's bound changes what the model computes from the same weights: a resume under another is
// refused naming the key, also for a run whose config.json predates the key (its default, clamp,
// leaves the hash as it was then, so that such a run resumes under clamp).
TEST_F(TrainerTest, ResumeWithAnotherDeltaBoundNamesTheKey) {
  Trainer(config_, options("run", "", 2)).train();
  const std::filesystem::path run_config = dir_ / "run" / "config.json";
  nlohmann::json saved = nlohmann::json::parse(std::ifstream(run_config));
  ASSERT_EQ(saved["model"]["position"]["pope"].erase("delta_bound"), 1u);
  std::ofstream(run_config) << saved.dump(2);
  for (const DeltaBound bound : {DeltaBound::none, DeltaBound::project}) {
    config_.model.position.pope.delta_bound = bound;
    const std::string message =
        pope::testing::thrown_message<ConfigError>([&] { Trainer(config_, options("run", "auto")); });
    EXPECT_NE(message.find(fmt::format("(model.position.pope.delta_bound = \"clamp\", this config says \"{}\")",
                                       name_of(bound))),
              std::string::npos)
        << message;
  }
  config_.model.position.pope.delta_bound = DeltaBound::clamp;
  EXPECT_EQ(Trainer(config_, options("run", "auto")).step(), 2);
}

// A resume under a larger train.steps stretches the decay: one warning names both ends and
// the learning rates under each; the same train.steps warns of nothing.
TEST_F(TrainerTest, ExtendingTrainStepsOnResumeWarnsOfTheStretchedSchedule) {
  Trainer(config_, options("run", "", 4)).train();
  const auto warnings = [&] {
    std::ifstream in(dir_ / "run" / "train.log");
    long count = 0;
    for (std::string line; std::getline(in, line);) count += line.find("train.steps is 24 instead of the run's 12") != std::string::npos;
    return count;
  };
  Trainer(config_, options("run", "auto", 6)).train();
  EXPECT_EQ(warnings(), 0);
  config_.train.steps = 24;
  Trainer(config_, options("run", "auto", 8)).train();
  EXPECT_EQ(warnings(), 1);
}

// With log_every > 1, quiet steps are read one step late (while the next runs); the guard
// and exact resume must work the same.
TEST_F(TrainerTest, StepsReadOneStepLateKeepTheGuardAndExactResume) {
  config_.train.log_every = 100;  // only steps 1 and the last are logged
  config_.train.max_nonfinite_steps = 3;
  std::vector<float> straight_params;
  {
    Trainer straight(config_, options("straight"));
    straight.train();
    straight_params = straight.model().parameters_to_host();
  }
  {
    Trainer first(config_, options("split", "", 5));
    first.train();
  }
  {
    Trainer second(config_, options("split", "auto"));
    second.train();
    EXPECT_EQ(second.model().parameters_to_host(), straight_params);
  }

  config_.train.steps = 30;  // continue the finished run, then break it
  Trainer longer(config_, options("split", "auto"));
  float* params = longer.model().parameters().as<float>();
  params[longer.model().layout().offset(longer.model().layout().index_of("final_norm.weight"))] =
      std::numeric_limits<float>::quiet_NaN();
  try {
    longer.train();
    FAIL() << "expected TrainingAborted";
  } catch (const TrainingAborted& e) {
    EXPECT_NE(std::string(e.what()).find("3 consecutive"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("last at step 15"), std::string::npos) << e.what();
  }
  EXPECT_EQ(latest_checkpoint(dir_ / "split")->filename(), "step_00000012");
}

// The short last validation batch is padded with masked rows: the mean is over real windows only.
TEST_F(TrainerTest, EvaluationCountsOnlyRealWindows) {
  const TokenDataset val = TokenDataset::open(config_.data.val, config_.model.vocab_size);
  const SequentialWindowSampler windows(val, config_.train.seq_len);
  for (const int micro : {3, 5, 7}) {  // a batch size that leaves a short last batch
    if (windows.window_count() % std::uint64_t(micro) != 0) config_.train.micro_batch_size = micro;
  }
  config_.train.batch_size = config_.train.micro_batch_size;
  ASSERT_NE(windows.window_count() % std::uint64_t(config_.train.micro_batch_size), 0u);
  config_.train.eval_batches = 1000;  // every window
  Trainer trainer(config_, options("run"));
  const int T = config_.train.seq_len;
  std::vector<std::int32_t> inputs(static_cast<std::size_t>(T)), targets(inputs.size());
  LossSum total;
  for (std::uint64_t w = 0; w < windows.window_count(); ++w) {
    ASSERT_EQ(windows.fill(w, 1, inputs.data(), targets.data()), 1);
    const LossSum one = trainer.model().forward(inputs.data(), targets.data(), 1, T);
    total.sum += one.sum;
    total.count += one.count;
  }
  EXPECT_EQ(total.count, long(windows.window_count()) * T);
  EXPECT_NEAR(trainer.evaluate(), total.mean(), 1e-6 * total.mean());
}

// --init-from: a fresh run starts from another run's weights (and only its weights).
TEST_F(TrainerTest, InitFromLoadsWeightsOnlyAndChecksShapes) {
  config_.train.steps = 4;
  Trainer(config_, options("base")).train();
  RunConfig longer = config_;
  longer.train.seq_len = 64;  // PoPE: a fine-tune at twice the length, same tensors
  longer.train.steps = 3;
  TrainerOptions fine = options("fine");
  fine.init_from = dir_ / "base";
  {  // destroyed before `resumed`: a Trainer holds its run directory's lock while it exists
    Trainer trainer(longer, fine);
    EXPECT_EQ(trainer.step(), 0);
    const CheckpointData base = load_checkpoint(dir_ / "base", trainer.model().layout());
    EXPECT_EQ(trainer.model().parameters_to_host(), base.params);
    EXPECT_EQ(trainer.train().steps_done, 3);  // its own schedule, from step 0
  }

  // A model of another shape is refused, naming the tensor and both shapes.
  RunConfig wider = config_;
  wider.model.n_embd = 48;
  TrainerOptions bad = options("bad");
  bad.init_from = dir_ / "base";
  const std::string message = [&] {
    try {
      Trainer t(wider, bad);
    } catch (const CheckpointError& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  }();
  EXPECT_NE(message.find("--init-from"), std::string::npos) << message;
  EXPECT_NE(message.find("wte.weight"), std::string::npos) << message;
  EXPECT_NE(message.find("[64, 32]"), std::string::npos) << message;
  EXPECT_NE(message.find("[64, 48]"), std::string::npos) << message;

  // Resuming the fine-tune ignores --init-from: the run's own checkpoint wins.
  TrainerOptions again = options("fine", "auto");
  again.init_from = dir_ / "base";
  longer.train.steps = 5;
  Trainer resumed(longer, again);
  EXPECT_EQ(resumed.step(), 3);
}
