// The indirect-indexing task: vocabulary, generator properties, split disjointness, rows and
// masking, config rules, the evaluation, and a tiny model that learns a reduced task.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "pope/backend.hpp"
#include "pope/indirect_indexing.hpp"
#include "pope/model.hpp"
#include "pope/train.hpp"
#include "trainer_fixture.hpp"

using namespace pope;
namespace ii = pope::indirect_indexing;

namespace {

IndirectIndexingConfig small_sets(IndirectIndexingConfig config = {}) {
  config.val_size = 500;
  config.test_size = 500;
  return config;
}

// A model and run config for the reduced task: short strings, shifts in [−2, 2].
RunConfig reduced_run_config() {
  RunConfig c;
  c.model.vocab_size = ii::kVocabSize;
  c.model.padded_vocab_size = ii::kVocabSize;
  c.model.n_layer = 2;
  c.model.n_head = 4;
  c.model.n_embd = 64;
  c.model.context_length = 16;
  c.model.position.kind = "pope";
  c.model.position.pope.delta_init = DeltaInit::uniform;
  c.data.kind = DataKind::indirect_indexing;
  c.data.indirect_indexing.seed = 7;
  c.data.indirect_indexing.train_size = 100000;
  c.data.indirect_indexing.val_size = 256;
  c.data.indirect_indexing.test_size = 256;
  c.data.indirect_indexing.min_len = 4;
  c.data.indirect_indexing.max_len = 6;
  c.data.indirect_indexing.max_shift = 2;
  c.optim.lr = 3e-3;
  c.optim.min_lr = 3e-4;
  c.optim.warmup_steps = 50;
  c.optim.beta2 = 0.99;
  c.train.steps = 20;
  c.train.batch_size = 32;
  c.train.micro_batch_size = 32;
  c.train.seq_len = 16;
  c.train.log_every = 10;
  c.train.eval_every = 10;
  c.train.checkpoint_every = 0;
  c.train.device = DeviceChoice::cpu;
  c.train.threads = 1;
  return c;
}

void expect_config_error(const RunConfig& config, const std::string& path, const std::string& fragment) {
  try {
    validate(config);
    ADD_FAILURE() << "expected a ConfigError at " << path;
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.path(), path) << e.what();
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

std::vector<nlohmann::json> metrics_of(const std::filesystem::path& run_dir, const std::string& event) {
  std::vector<nlohmann::json> records;
  std::ifstream in(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto record = nlohmann::json::parse(line);
    if (record["event"] == event) records.push_back(std::move(record));
  }
  return records;
}

}  // namespace

TEST(IndirectIndexing, VocabularyRoundTripsEveryToken) {
  std::set<char> characters;
  for (std::int32_t token = 0; token < ii::kVocabSize; ++token) {
    const char c = ii::char_of(token);
    EXPECT_EQ(ii::token_of(c), token) << c;
    characters.insert(c);
  }
  EXPECT_EQ(characters.size(), std::size_t(ii::kVocabSize));
  EXPECT_EQ(ii::token_of('A'), 0);
  EXPECT_EQ(ii::token_of('z'), 51);
  EXPECT_EQ(ii::token_of(' '), ii::kPadToken);
  EXPECT_THROW(ii::token_of('?'), std::invalid_argument);
  EXPECT_THROW(ii::char_of(ii::kVocabSize), std::invalid_argument);
  EXPECT_THROW(ii::char_of(-1), std::invalid_argument);
}

TEST(IndirectIndexing, ExamplesHaveThePapersFormatAndProperties) {
  const IndirectIndexingTask task(small_sets());
  const std::regex format("([A-Za-z]+), ([A-Za-z]), ([+-])([0-9]+), ([A-Za-z])");
  std::set<int> shifts, lengths;
  for (IndirectSplit split : {IndirectSplit::train, IndirectSplit::val, IndirectSplit::test}) {
    for (std::uint64_t i = 0; i < 500; ++i) {
      const IndirectExample e = task.example(split, i);
      const int L = int(e.source.size());
      ASSERT_GE(L, 20);
      ASSERT_LE(L, 40);
      EXPECT_EQ(std::set<char>(e.source.begin(), e.source.end()).size(), e.source.size()) << e.text();
      ASSERT_GE(e.source_index, 0);
      ASSERT_LT(e.source_index, L);
      ASSERT_GE(e.source_index + e.shift, 0) << e.text();
      ASSERT_LT(e.source_index + e.shift, L) << e.text();
      EXPECT_NE(e.shift, 0);
      EXPECT_LE(std::abs(e.shift), 15);

      std::smatch m;
      const std::string text = e.text();
      ASSERT_TRUE(std::regex_match(text, m, format)) << text;
      const std::string source = m[1];
      EXPECT_EQ(source, e.source);
      const auto at = source.find(m[2].str()[0]);  // distinct letters: one position
      const int shift = (m[3] == "-" ? -1 : 1) * std::stoi(m[4]);
      EXPECT_EQ(m[5].str()[0], source[at + std::size_t(shift)]) << text;
      EXPECT_EQ(e.prompt_tokens().size(), text.size() - 1);
      shifts.insert(e.shift);
      lengths.insert(L);
    }
  }
  EXPECT_EQ(shifts.size(), 30u) << "every shift in [−15, 15] but 0";
  EXPECT_EQ(lengths.size(), 21u) << "every length in [20, 40]";
  EXPECT_EQ(ii::max_prompt_length(IndirectIndexingConfig{}), 50);
}

TEST(IndirectIndexing, ExamplesAreAPureFunctionOfSeedSplitAndIndex) {
  const IndirectIndexingTask a(small_sets()), b(small_sets());
  IndirectIndexingConfig other_seed = small_sets();
  other_seed.seed = 1;
  const IndirectIndexingTask c(other_seed);
  int differing = 0;
  for (std::uint64_t i : {0ull, 1ull, 99ull, 999'999ull}) {
    EXPECT_EQ(a.example(IndirectSplit::train, i), b.example(IndirectSplit::train, i));
    differing += a.example(IndirectSplit::train, i) == c.example(IndirectSplit::train, i) ? 0 : 1;
  }
  EXPECT_EQ(differing, 4);
  EXPECT_NE(a.example(IndirectSplit::val, 3), a.example(IndirectSplit::test, 3));
  EXPECT_THROW(a.example(IndirectSplit::test, 500), std::out_of_range);
  EXPECT_THROW(a.example(IndirectSplit::train, 1'000'000), std::out_of_range);
}

// Two-letter strings with shifts ±1 leave 52·51·2 = 5304 distinct examples: without the
// rejection, thousands of the 20k training draws below would repeat held-out examples.
TEST(IndirectIndexing, SplitsAreDisjointEvenInATinyExampleSpace) {
  IndirectIndexingConfig config;
  config.min_len = 2;
  config.max_len = 2;
  config.max_shift = 1;
  config.val_size = 1000;
  config.test_size = 1000;
  const IndirectIndexingTask task(config);
  std::set<std::string> test, val;
  for (std::uint64_t i = 0; i < 1000; ++i) {
    test.insert(task.example(IndirectSplit::test, i).text());
    val.insert(task.example(IndirectSplit::val, i).text());
  }
  for (const std::string& text : val) EXPECT_FALSE(test.contains(text)) << text;
  std::set<std::string> seen_in_training;
  for (std::uint64_t i = 0; i < 20000; ++i) {
    const std::string text = task.example(IndirectSplit::train, i).text();
    ASSERT_FALSE(test.contains(text) || val.contains(text)) << "training example " << i << " is held out: " << text;
    seen_in_training.insert(text);
  }
  // The rejection leaves the rest of the space reachable.
  EXPECT_GT(seen_in_training.size(), 5304u - test.size() - val.size() - 200u);
}

TEST(IndirectIndexing, AnExampleSpaceTooSmallForTheHeldOutSplitsIsADataError) {
  IndirectIndexingConfig config;
  config.min_len = 2;
  config.max_len = 2;
  config.max_shift = 1;
  config.test_size = 100000;  // covers all 5304 examples: validation finds none left
  try {
    IndirectIndexingTask task(config);
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("too small"), std::string::npos) << e.what();
  }
}

TEST(IndirectIndexing, RowsMaskEverythingButTheTarget) {
  IndirectExample e{"NZTUIGWkXFrhCJDzscat", 0, 4};
  EXPECT_EQ(e.text(), "NZTUIGWkXFrhCJDzscat, N, +4, I");
  const int T = 32;
  std::vector<std::int32_t> inputs(T), targets(T);
  IndirectIndexingTask::fill_row(e, T, inputs.data(), targets.data());
  const std::vector<std::int32_t> prompt = e.prompt_tokens();
  ASSERT_EQ(prompt.size(), 29u);  // 20 letters + ", N, +4, "
  EXPECT_TRUE(std::equal(prompt.begin(), prompt.end(), inputs.begin()));
  for (int t = 29; t < T; ++t) EXPECT_EQ(inputs[std::size_t(t)], ii::kPadToken);
  for (int t = 0; t < T; ++t) EXPECT_EQ(targets[std::size_t(t)], t == 28 ? ii::token_of('I') : -1) << t;
  EXPECT_EQ(IndirectExample({"abc", 2, -2}).text(), "abc, c, -2, a");
  EXPECT_THROW(IndirectIndexingTask::fill_row(e, 28, inputs.data(), targets.data()), std::invalid_argument);
}

TEST(IndirectIndexing, TrainingSampleIDependsOnlyOnSeedAndI) {
  const IndirectIndexingTask task(small_sets());
  const int T = 50, B = 10;
  std::vector<std::int32_t> all_in(B * T), all_tg(B * T), part_in(3 * T), part_tg(3 * T);
  task.fill_training(42, 0, B, T, all_in.data(), all_tg.data());
  task.fill_training(42, 5, 3, T, part_in.data(), part_tg.data());
  EXPECT_TRUE(std::equal(part_in.begin(), part_in.end(), all_in.begin() + 5 * T));
  EXPECT_TRUE(std::equal(part_tg.begin(), part_tg.end(), all_tg.begin() + 5 * T));
  for (int b = 0; b < B; ++b)
    EXPECT_EQ(std::count_if(all_tg.begin() + b * T, all_tg.begin() + (b + 1) * T, [](int t) { return t >= 0; }), 1);
  task.fill_training(43, 0, 3, T, part_in.data(), part_tg.data());
  EXPECT_FALSE(std::equal(part_in.begin(), part_in.end(), all_in.begin()));
}

TEST(IndirectIndexing, ConfigRulesNameTheKey) {
  const RunConfig good = reduced_run_config();
  EXPECT_NO_THROW(validate(good));
  RunConfig c = good;
  c.model.vocab_size = 50257;
  c.model.padded_vocab_size = 50304;
  expect_config_error(c, "model.vocab_size", "expected 66");
  c = good;
  c.train.seq_len = 13;  // max_len 6 + 8 + 1 digit = 15
  expect_config_error(c, "train.seq_len", "at least 15");
  c = good;
  c.data.indirect_indexing.min_len = 7;
  expect_config_error(c, "data.indirect_indexing.min_len", "at most data.indirect_indexing.max_len (6)");
  c = good;
  c.data.indirect_indexing.max_shift = 0;
  expect_config_error(c, "data.indirect_indexing.max_shift", "zero_shift is false");
  c.data.indirect_indexing.zero_shift = true;
  EXPECT_NO_THROW(validate(c));
  c = good;
  c.data.train = "data/demo/train.bin";
  expect_config_error(c, "data.train", "the task generates its data");
  c = good;
  c.data.indirect_indexing.max_len = 53;
  expect_config_error(c, "data.indirect_indexing.max_len", "in [2, 52]");
}

TEST(IndirectIndexing, ZeroShiftsAppearOnlyWhenAllowed) {
  IndirectIndexingConfig config = small_sets();
  config.zero_shift = true;
  config.max_shift = 1;
  const IndirectIndexingTask task(config);
  std::set<int> shifts;
  for (std::uint64_t i = 0; i < 300; ++i) shifts.insert(task.example(IndirectSplit::train, i).shift);
  EXPECT_EQ(shifts, (std::set<int>{-1, 0, 1}));
  EXPECT_EQ(IndirectExample({"ab", 1, 0}).text(), "ab, b, +0, b");
}

TEST(IndirectIndexing, ShippedConfigsFollowThePaper) {
  const std::filesystem::path dir = std::filesystem::path(POPE_SOURCE_DIR) / "configs";
  struct Expected {
    const char* name;
    const char* kind;
  };
  for (const Expected& e : {Expected{"indirect_indexing_pope", "pope"}, Expected{"indirect_indexing_rope", "rope"},
                            Expected{"indirect_indexing_rope_half", "rope"},
                            Expected{"indirect_indexing_alibi_half", "alibi"}}) {
    SCOPED_TRACE(e.name);
    const RunConfig c = load_config(dir / (std::string(e.name) + ".json"));
    EXPECT_EQ(c.data.kind, DataKind::indirect_indexing);
    EXPECT_EQ(c.model.position.kind, e.kind);
    EXPECT_EQ(c.model.n_embd, 512);
    EXPECT_EQ(c.model.n_head, 8);
    EXPECT_EQ(c.model.n_layer, 8);
    EXPECT_EQ(c.optim.lr, 2e-4);
    EXPECT_EQ(c.optim.min_lr, 2e-5);
    EXPECT_EQ(c.optim.warmup_steps, 4000);
    EXPECT_EQ(c.optim.beta2, 0.99);
    EXPECT_EQ(c.optim.weight_decay, 0.01);
    EXPECT_EQ(c.optim.grad_clip, 1.0);
    EXPECT_EQ(c.train.batch_size, 64);
    EXPECT_EQ(c.train.steps, 100000);
    EXPECT_GE(c.train.seq_len, ii::max_prompt_length(c.data.indirect_indexing));
    EXPECT_EQ(c.data.indirect_indexing.train_size, 1000000);
    EXPECT_EQ(c.data.indirect_indexing.val_size, 10000);
    EXPECT_EQ(c.data.indirect_indexing.test_size, 10000);
  }
  EXPECT_EQ(load_config(dir / "indirect_indexing_pope.json").model.position.pope.delta_init, DeltaInit::uniform);
  EXPECT_EQ(load_config(dir / "indirect_indexing_rope_half.json").model.position.rope.fraction, 0.5);
  EXPECT_EQ(load_config(dir / "indirect_indexing_alibi_half.json").model.position.alibi.head_fraction, 0.5);
}

// Batched scoring agrees with one example at a time, and its loss with the backend's
// cross-entropy on the same rows.
TEST(IndirectIndexing, EvaluationMatchesPerExampleScoring) {
  const RunConfig config = reduced_run_config();
  auto backend = make_backend(DeviceChoice::cpu, "float", 1);
  Model model(config.model, *backend);
  model.initialize(3);
  const IndirectIndexingTask task(config.data.indirect_indexing);
  const int T = config.train.seq_len;
  const IndirectIndexingScore batched = evaluate_indirect_indexing(model, task, IndirectSplit::val, 7, T);
  const IndirectIndexingScore single = evaluate_indirect_indexing(model, task, IndirectSplit::val, 1, T);
  EXPECT_EQ(batched.total.examples, 256);
  EXPECT_EQ(batched.total.correct, single.total.correct);
  EXPECT_NEAR(batched.mean_loss(), single.mean_loss(), 1e-5);
  long by_shift = 0;
  for (const auto& [shift, tally] : batched.by_shift) {
    EXPECT_TRUE(shift != 0 && std::abs(shift) <= 2) << shift;
    by_shift += tally.examples;
  }
  EXPECT_EQ(by_shift, 256);

  LossSum reference;
  std::vector<std::int32_t> inputs(static_cast<std::size_t>(T)), targets(inputs.size());
  for (std::uint64_t i = 0; i < 256; ++i) {
    task.fill_split(IndirectSplit::val, i, 1, T, inputs.data(), targets.data());
    const LossSum one = model.forward(inputs.data(), targets.data(), 1, T);
    EXPECT_EQ(one.count, 1);
    reference.sum += one.sum;
    reference.count += one.count;
  }
  EXPECT_NEAR(batched.mean_loss(), reference.mean(), 1e-4);

  const nlohmann::json json = score_to_json(batched);
  EXPECT_EQ(json["examples"], 256);
  EXPECT_TRUE(json["by_shift"].contains("-2") && json["by_shift"].contains("+1"));
}

// The training loss is the mean over target tokens only, not over every position of the row.
TEST(IndirectIndexing, TrainerLossIsTheMeanOverTargetTokens) {
  RunConfig config = reduced_run_config();
  config.train.steps = 1;
  config.train.eval_every = 0;
  const auto dir = pope::testing::fresh_dir("indirect_loss");
  std::vector<std::int32_t> inputs(std::size_t(config.train.batch_size * config.train.seq_len)),
      targets(inputs.size());
  LossSum expected;
  {
    Trainer trainer(config, TrainerOptions{dir / "run", "", true, 0, {}});
    IndirectIndexingTask(config.data.indirect_indexing)
        .fill_training(config.train.seed, 0, config.train.batch_size, config.train.seq_len, inputs.data(),
                       targets.data());
    expected = trainer.model().forward(inputs.data(), targets.data(), config.train.batch_size, config.train.seq_len);
    EXPECT_EQ(expected.count, config.train.batch_size);
    const TrainingSummary summary = trainer.train();
    ASSERT_TRUE(summary.last_train_loss.has_value());
    EXPECT_NEAR(*summary.last_train_loss, expected.mean(), 1e-5 * expected.mean());
    EXPECT_GT(*summary.last_train_loss, 3.0) << "an untrained model is near ln 66 = 4.19 per target";
    EXPECT_TRUE(summary.last_val_accuracy.has_value()) << "the final step evaluates";
  }
  std::filesystem::remove_all(dir);
}

// The reduced task (strings of 3–4 letters, shifts ±1): a 2-layer PoPE model learns it on
// one core within the test's time (about 25 s of CPU; the CPU backend is deterministic, so
// the outcome is the same on every run); periodic evaluations land in metrics.jsonl.
TEST(IndirectIndexing, TinyModelLearnsTheReducedTask) {
  RunConfig config = reduced_run_config();
  config.data.indirect_indexing.min_len = 3;
  config.data.indirect_indexing.max_len = 4;
  config.data.indirect_indexing.max_shift = 1;
  config.optim.warmup_steps = 20;
  config.train.steps = 600;
  config.train.eval_every = 200;
  const auto dir = pope::testing::fresh_dir("indirect_learns");
  const auto start = std::chrono::steady_clock::now();
  double accuracy = 0.0;
  {
    Trainer trainer(config, TrainerOptions{dir / "run", "", true, 0, {}});
    const TrainingSummary summary = trainer.train();
    ASSERT_TRUE(summary.last_val_accuracy.has_value());
    accuracy = *summary.last_val_accuracy;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Chance: 1/52 for a letter; copying a random letter of the string scores about 1/3.5.
  EXPECT_GT(accuracy, 0.4) << "after " << config.train.steps << " steps, " << seconds << " s";
  const auto evals = metrics_of(dir / "run", "eval");
  ASSERT_EQ(evals.size(), 4u);  // steps 0, 200, 400, 600
  EXPECT_EQ(evals.back()["step"], 600);
  EXPECT_DOUBLE_EQ(evals.back()["val_accuracy"].get<double>(), accuracy);
  EXPECT_TRUE(evals.back()["val_accuracy_by_shift"].contains("-1"));
  EXPECT_LT(evals.front()["val_accuracy"].get<double>(), 0.1);
  EXPECT_LT(evals.back()["val_loss"].get<double>(), evals.front()["val_loss"].get<double>() - 1.5);
  std::filesystem::remove_all(dir);
}
