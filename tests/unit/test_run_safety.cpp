// Work that must never be lost: inputs checked before the first step, the final checkpoint
// written before anything that can still fail, SIGHUP stopping like SIGTERM, another run's
// records left alone, the checkpoint directory checked at start, no step logged twice, no
// non-finite checkpoint, no tampered trainer state resumed.
#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "pope/data.hpp"
#include "pope/train.hpp"
#include "scratch_dir.hpp"
#include "trainer_fixture.hpp"

using namespace pope;
using pope::testing::thrown_message;

namespace {

using RunSafetyTest = pope::testing::TrainerRunTest;

// The index of the first line of `file` holding `text`, or -1.
long line_index(const std::filesystem::path& file, const std::string& text) {
  std::ifstream in(file);
  long index = 0;
  for (std::string line; std::getline(in, line); ++index)
    if (line.find(text) != std::string::npos) return index;
  return -1;
}

}  // namespace

// With train.eval_every = 0 only the final evaluation reads the validation data: a file too
// short for one window is refused before the first step, not after the last.
TEST_F(RunSafetyTest, ValidationDataTooShortForOneWindowIsRefusedAtStart) {
  const auto short_val = dir_ / "data" / "short_val.bin";
  write_llmc_shard(short_val, pope::testing::patterned_tokens(std::size_t(config_.train.seq_len), 64, 3));
  config_.data.val = short_val.string();
  const std::string message = thrown_message<DataError>([&] { Trainer(config_, options("run")); });
  EXPECT_NE(message.find("short_val.bin"), std::string::npos) << message;
  EXPECT_NE(message.find("train.seq_len + 1 = 33"), std::string::npos) << message;
}

// The last step's checkpoint is on disk before its evaluation starts.
TEST_F(RunSafetyTest, TheFinalCheckpointPrecedesTheFinalEvaluation) {
  config_.train.steps = 3;
  Trainer(config_, options("run")).train();
  const auto log = dir_ / "run" / "train.log";
  const long checkpoint = line_index(log, "checkpoint " + (dir_ / "run" / "checkpoints" / "step_00000003").string());
  const long evaluation = line_index(log, "step 3 | val loss");
  ASSERT_GE(checkpoint, 0);
  ASSERT_GE(evaluation, 0);
  EXPECT_LT(checkpoint, evaluation);
}

// SIGHUP (a closed terminal, a dropped ssh session) stops the run as SIGTERM does.
TEST_F(RunSafetyTest, HangupStopsLikeTerminateWithACheckpoint) {
  Trainer trainer(config_, options("run"));
  Trainer::request_stop(SIGHUP);
  const TrainingSummary summary = trainer.train();
  EXPECT_EQ(summary.reason, StopReason::terminated);
  EXPECT_EQ(latest_checkpoint(dir_ / "run"), summary.last_checkpoint);
}

// A run that stopped before its first checkpoint still owns its metrics.jsonl and config.json:
// a new run there is refused, naming the file, and --resume auto continues it.
TEST_F(RunSafetyTest, ANewRunRefusesAnotherRunsRecords) {
  for (const std::string record : {"metrics.jsonl", "config.json"}) {
    const auto run = dir_ / ("run_" + record);
    std::filesystem::create_directories(run);
    std::ofstream(run / record) << "{}\n";
    const std::string message =
        thrown_message<ConfigError>([&] { Trainer(config_, options("run_" + record)); });
    EXPECT_NE(message.find("another run's " + record), std::string::npos) << message;
    EXPECT_NE(message.find("--resume auto"), std::string::npos) << message;
    EXPECT_EQ(Trainer(config_, options("run_" + record, "auto")).step(), 0);
  }
}

// `checkpoints` as a file is found before the first step, not at the first save.
TEST_F(RunSafetyTest, ACheckpointsFileIsFoundAtStart) {
  std::filesystem::create_directories(dir_ / "run");
  std::ofstream(dir_ / "run" / "checkpoints") << "not a directory\n";
  const std::string message = thrown_message<CheckpointError>([&] { Trainer(config_, options("run")); });
  EXPECT_NE(message.find("checkpoints\" exists and is not a directory"), std::string::npos) << message;
  EXPECT_FALSE(std::filesystem::exists(dir_ / "run" / "metrics.jsonl"));
}

// A run that crashed before its first checkpoint, continued with --resume auto, starts from
// step 0 again: its metrics.jsonl holds each step once, not the crashed run's steps as well.
TEST_F(RunSafetyTest, ResumeBeforeAnyCheckpointLogsEveryStepOnce) {
  config_.train.steps = 4;
  TrainerOptions crashed = options("run");
  crashed.write_checkpoints = false;  // what a crash before the first checkpoint leaves
  Trainer(config_, crashed).train();
  ASSERT_FALSE(latest_checkpoint(dir_ / "run"));
  { std::ofstream(dir_ / "run" / "metrics.jsonl", std::ios::app) << "{\"event\":\"tra"; }  // a line torn by the crash
  Trainer(config_, options("run", "auto")).train();
  std::map<long, int> logged;
  std::ifstream in(dir_ / "run" / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto record = nlohmann::json::parse(line);
    if (record["event"] == "train") ++logged[record["step"].get<long>()];
  }
  EXPECT_EQ(logged, (std::map<long, int>{{1, 1}, {2, 1}, {3, 1}, {4, 1}}));
}

// An update that blows the weights up to infinity (as optim.lr = 1e300 does) writes no
// checkpoint of them: the run fails naming the tensor, the last good checkpoint stays the newest.
TEST_F(RunSafetyTest, ADivergedRunWritesNoNonFiniteCheckpoint) {
  config_.train.steps = 4;
  config_.train.checkpoint_every = 1;
  {
    Trainer good(config_, options("run", "", 2));
    good.train();
  }
  // Finite moments so large that the next update overflows the weights.
  const auto checkpoint = *latest_checkpoint(dir_ / "run");
  {
    Trainer reader(config_, options("reader"));
    CheckpointData data = load_checkpoint(checkpoint, reader.model().layout());
    std::fill(data.adam_m.begin(), data.adam_m.end(), 1e38f);
    save_checkpoint(dir_ / "run", reader.model().layout(), data, 2);
  }
  Trainer diverging(config_, options("run", "auto"));
  const std::string message = thrown_message<CheckpointError>([&] { diverging.train(); });
  EXPECT_NE(message.find("step 3: tensor '"), std::string::npos) << message;
  EXPECT_NE(message.find("non-finite values"), std::string::npos) << message;
  EXPECT_NE(message.find("no checkpoint written"), std::string::npos) << message;
  EXPECT_EQ(latest_checkpoint(dir_ / "run")->filename(), "step_00000002");
}

// A trainer.json edited by hand (or damaged) is refused on resume, naming the file, the field
// and what was expected, before any weight is loaded; so is a train.steps below the run's step.
TEST_F(RunSafetyTest, ATamperedTrainerStateIsRefusedNamingTheField) {
  config_.train.checkpoint_every = 2;
  Trainer(config_, options("run", "", 2)).train();
  const auto trainer_file = *latest_checkpoint(dir_ / "run") / "trainer.json";
  const auto original = nlohmann::json::parse(std::ifstream(trainer_file));
  const std::vector<std::pair<nlohmann::json, std::string>> cases = {
      {{{"samples_consumed", 17}}, "\"samples_consumed\" is 17, expected step × train.batch_size = 2 × 8 = 16"},
      {{{"consecutive_nonfinite", 5}}, "\"consecutive_nonfinite\" is 5, expected at most 4"},
      {{{"rng", {"0", "0", "0", "0"}}}, "\"rng\" is [\"0\",\"0\",\"0\",\"0\"], expected a xoshiro256** state"},
      {{{"last_val_loss", -1}}, "\"last_val_loss\" is -1, expected a number >= 0 or null"}};
  for (const auto& [patch, expected] : cases) {
    nlohmann::json tampered = original;
    tampered.update(patch);
    std::ofstream(trainer_file) << tampered.dump();
    const std::string message = thrown_message<CheckpointError>([&] { Trainer(config_, options("run", "auto")); });
    EXPECT_NE(message.find(trainer_file.string() + ": " + expected), std::string::npos) << message;
  }
  std::ofstream(trainer_file) << original.dump();
  config_.train.steps = 1;
  const std::string message = thrown_message<CheckpointError>([&] { Trainer(config_, options("run", "auto")); });
  EXPECT_NE(message.find(trainer_file.string() + ": \"step\" is 2, expected at most train.steps = 1"),
            std::string::npos)
      << message;
  config_.train.steps = 12;
  EXPECT_EQ(Trainer(config_, options("run", "auto")).step(), 2);
}
