// pope-eval's library: lengths parsing, batch planning, the perplexity sweep against
// window-by-window forwards, reproducing the trainer's validation loss, checkpoint opening
// with overrides, and the CSV round trip.
#include <gtest/gtest.h>

#include <cmath>

#include "pope/checkpoint.hpp"
#include "pope/eval.hpp"
#include "pope/train.hpp"
#include "scratch_dir.hpp"
#include "trainer_fixture.hpp"

using namespace pope;
using pope::testing::patterned_tokens;
using pope::testing::ScratchDir;
using pope::testing::thrown_message;

namespace {

ModelConfig tiny_model(const std::string& kind) {
  ModelConfig m;
  m.vocab_size = 64;
  m.padded_vocab_size = 64;
  m.n_layer = 2;
  m.n_head = 2;
  m.n_embd = 16;
  m.context_length = 8;
  m.position.kind = kind;
  return m;
}

// Σ NLL over every window of every file, each window its own B = 1 forward, and over the last
// `tail` positions: the definition, computed the plain way.
struct Reference {
  double sum = 0.0, tail_sum = 0.0;
  long tokens = 0, windows = 0;
};
Reference window_by_window(Model& model, const std::vector<std::vector<std::uint16_t>>& books, int L, int tail) {
  Reference ref;
  std::vector<float> losses(std::size_t(L), 0.0f);
  for (const auto& book : books)
    for (std::size_t start = 0; start + std::size_t(L) + 1 <= book.size(); start += std::size_t(L)) {
      std::vector<std::int32_t> inputs(book.begin() + std::ptrdiff_t(start), book.begin() + std::ptrdiff_t(start) + L);
      std::vector<std::int32_t> targets(book.begin() + std::ptrdiff_t(start) + 1,
                                        book.begin() + std::ptrdiff_t(start) + L + 1);
      const LossSum part = model.forward(inputs.data(), targets.data(), 1, L, losses.data());
      ref.sum += part.sum;
      ref.tokens += part.count;
      ++ref.windows;
      for (int t = std::max(0, L - tail); t < L; ++t) ref.tail_sum += losses[std::size_t(t)];
    }
  return ref;
}

}  // namespace

TEST(EvalLengths, ParsesRangesListsAndSingleLengths) {
  EXPECT_EQ(parse_lengths("1024:10240:1024"),
            (std::vector<int>{1024, 2048, 3072, 4096, 5120, 6144, 7168, 8192, 9216, 10240}));
  EXPECT_EQ(parse_lengths("256:1000:256"), (std::vector<int>{256, 512, 768}));
  EXPECT_EQ(parse_lengths("64,128,1024"), (std::vector<int>{64, 128, 1024}));
  EXPECT_EQ(parse_lengths("512"), (std::vector<int>{512}));
  for (const char* bad : {"", "0", "-5", "abc", "1:2", "1:2:3:4", "10:5:1", "5,3", "4,4", "1024:2048:0", "1e3",
                          "1024:", ":1024:1", "1,,2", "1,"}) {
    const std::string message = thrown_message<ConfigError>([&] { parse_lengths(bad); });
    EXPECT_NE(message.find("--lengths"), std::string::npos) << bad << ": " << message;
  }
}

TEST(EvalLengths, RefusesMoreLengthsThanTheBoundBeforeExpandingThem) {
  EXPECT_EQ(parse_lengths("1:1024:1").size(), std::size_t(kMaxEvalLengths));
  std::string list = "1";
  for (int length = 2; length <= kMaxEvalLengths; ++length) list.append(",").append(std::to_string(length));
  EXPECT_EQ(parse_lengths(list).size(), std::size_t(kMaxEvalLengths));
  // 16:2147483647:1 (2^31 − 16 lengths) is counted, not expanded: expanding it took gigabytes.
  const std::vector<std::string> too_many = {"1:1025:1", "16:2147483647:1", "1:1000000:1", list + ",2000"};
  for (const std::string& bad : too_many) {
    const std::string message = thrown_message<ConfigError>([&] { parse_lengths(bad); });
    EXPECT_NE(message.find("--lengths"), std::string::npos) << message;
    EXPECT_NE(message.find("at most 1024"), std::string::npos) << message;
  }
  EXPECT_NE(thrown_message<ConfigError>([] { parse_lengths("16:2147483647:1"); }).find("gives 2147483632 lengths"),
            std::string::npos);
}

TEST(EvalLengths, WindowsPerForwardUseTheFewestForwardsSharedEvenly) {
  EXPECT_EQ(windows_per_forward(10, 100, 1000), 10);   // all in one forward
  EXPECT_EQ(windows_per_forward(10, 100, 100000), 10); // never more than needed
  EXPECT_EQ(windows_per_forward(10, 100, 350), 3);     // 4 forwards of 3, 3, 3, 1 (padded)
  EXPECT_EQ(windows_per_forward(9, 100, 400), 3);      // 3 forwards of 3 rather than 4 + 4 + 1
  EXPECT_EQ(windows_per_forward(10, 100, 50), 1);      // one window even past the budget
  EXPECT_EQ(windows_per_forward(1, 10240, 32768), 1);
  EXPECT_THROW(windows_per_forward(0, 100, 1000), std::invalid_argument);
}

TEST(EvalLengths, SpreadWindowsAreTheTrainersChoice) {
  EXPECT_EQ(spread_window_index(0, 3, 9), 0u);
  EXPECT_EQ(spread_window_index(1, 3, 9), 3u);
  EXPECT_EQ(spread_window_index(2, 3, 9), 6u);
  EXPECT_EQ(spread_window_index(4, 5, 5), 4u);
  EXPECT_EQ(spread_window_index(1, 2, std::uint64_t(1) << 62), std::uint64_t(1) << 61);  // no overflow
  EXPECT_THROW(spread_window_index(3, 3, 9), std::invalid_argument);
  EXPECT_THROW(spread_window_index(0, 10, 9), std::invalid_argument);
}

// Two books, windows past the model's context length (8), several batch budgets: the sweep
// equals one forward per window, whatever the batching and padding.
TEST(EvalLengths, SweepEqualsWindowByWindowForwardsPastTheTrainingLength) {
  ScratchDir dir;
  const std::vector<std::vector<std::uint16_t>> books{patterned_tokens(100, 64, 3), patterned_tokens(57, 64, 4)};
  write_llmc_shard(dir / "a.bin", books[0]);
  write_llmc_shard(dir / "b.bin", books[1]);
  const TokenDataset data = TokenDataset::open(dir.path().string(), 64);
  auto backend = make_backend(DeviceChoice::cpu, "float", 1);
  for (const std::string kind : {"rope", "pope", "alibi"}) {
    Model model(tiny_model(kind), *backend);
    model.initialize(7);
    for (const std::int64_t budget : {1L, 40L, 100000L}) {
      LengthSweepOptions options;
      options.lengths = {4, 16, 24, 60};
      options.tail = 10;
      options.max_batch_tokens = budget;
      const auto results = sweep_lengths(model, data, options);
      ASSERT_EQ(results.size(), 4u);
      for (const LengthResult& r : results) {
        const Reference ref = window_by_window(model, books, r.length, options.tail);
        SCOPED_TRACE(kind + " L=" + std::to_string(r.length) + " budget " + std::to_string(budget));
        EXPECT_EQ(r.windows, std::uint64_t(ref.windows));
        EXPECT_EQ(r.tokens, ref.tokens);
        EXPECT_EQ(r.tokens, std::int64_t(r.windows) * r.length);
        EXPECT_EQ(r.tail_tokens, std::int64_t(r.windows) * std::min(r.length, options.tail));
        EXPECT_NEAR(r.nll_sum, ref.sum, 1e-4 * ref.sum);
        EXPECT_NEAR(r.tail_nll_sum, ref.tail_sum, 1e-4 * ref.tail_sum);
        EXPECT_TRUE(std::isfinite(r.perplexity()));
        EXPECT_NEAR(r.perplexity(), std::exp(ref.sum / double(ref.tokens)), 1e-3);
      }
    }
  }
  // 99 / 4 + 56 / 4 windows at L = 4; at L = 60 only the first book has one.
  LengthSweepOptions options;
  options.lengths = {4, 60, 200};
  Model model(tiny_model("pope"), *backend);
  model.initialize(1);
  const auto results = sweep_lengths(model, data, options);
  EXPECT_EQ(results[0].windows, 24u + 14u);
  EXPECT_EQ(results[1].windows, 1u);
  EXPECT_EQ(results[2].windows, 0u);  // longer than every book: reported, not fatal
  EXPECT_TRUE(std::isnan(results[2].perplexity()));
}

// Item 5: at L = train.seq_len with --max-windows = eval_batches × micro_batch_size, the sweep
// picks the trainer's validation windows and reproduces Trainer::evaluate().
TEST(EvalLengths, ReproducesTheTrainersValidationLoss) {
  const auto dir = pope::testing::fresh_dir("eval_val");
  RunConfig config = pope::testing::tiny_run_config(dir / "data");
  Trainer trainer(config, TrainerOptions{dir / "run", "", true, 0, {}});
  trainer.train();
  const double logged = trainer.evaluate();

  const TokenDataset val = TokenDataset::open(config.data.val, config.model.vocab_size);
  LengthSweepOptions options;
  options.lengths = {config.train.seq_len};
  options.max_windows = std::uint64_t(config.train.eval_batches) * std::uint64_t(config.train.micro_batch_size);
  ASSERT_LT(options.max_windows, SequentialWindowSampler(val, config.train.seq_len).window_count())
      << "the test must exercise the spread choice";
  const auto spread = sweep_lengths(trainer.model(), val, options);
  EXPECT_NEAR(spread[0].mean_nll(), logged, 1e-6);

  // Loaded back from the checkpoint through the evaluation path, the same number.
  const EvalCheckpoint checkpoint = open_eval_checkpoint(dir / "run", {});
  auto backend = make_backend(DeviceChoice::cpu, "float", 1);
  auto model = load_eval_model(checkpoint, *backend);
  EXPECT_NEAR(sweep_lengths(*model, val, options)[0].mean_nll(), logged, 1e-6);
  std::filesystem::remove_all(dir);
}

TEST(EvalCheckpoint, OpensRunAndStepDirectoriesWithOverrides) {
  const auto dir = pope::testing::fresh_dir("eval_ckpt");
  RunConfig config = pope::testing::tiny_run_config(dir / "data");
  config.model.position.kind = "rope";
  config.train.steps = 2;
  Trainer(config, TrainerOptions{dir / "rope_run", "", true, 0, {}}).train();
  const auto step_dir = dir / "rope_run" / "checkpoints" / "step_00000002";
  ASSERT_TRUE(std::filesystem::is_directory(step_dir));

  const EvalCheckpoint from_run = open_eval_checkpoint(dir / "rope_run", {});
  EXPECT_EQ(from_run.step_dir, step_dir);
  EXPECT_EQ(from_run.step, 2);
  EXPECT_EQ(from_run.label, "rope_run");
  EXPECT_EQ(from_run.config.model.position.kind, "rope");
  EXPECT_EQ(describe_position(from_run.config.model.position), "rope");

  RopeScalingOverride yarn;
  yarn.kind = "yarn";
  yarn.factor = 4.0;
  yarn.yarn_beta = 16.0;
  const EvalCheckpoint scaled = open_eval_checkpoint(step_dir.string() + "/", {"model.context_length=16"}, yarn);
  EXPECT_EQ(scaled.label, "rope_run");
  EXPECT_EQ(scaled.config.model.position.rope.scaling.kind, RopeScalingKind::yarn);
  EXPECT_EQ(scaled.config.model.position.rope.scaling.factor, 4.0);
  EXPECT_EQ(scaled.config.model.position.rope.scaling.yarn_beta, 16.0);
  EXPECT_EQ(scaled.config.model.context_length, 16);
  EXPECT_EQ(describe_position(scaled.config.model.position), "rope+yarn(s=4 a=1 b=16)");
  RopeScalingOverride dynamic;
  dynamic.kind = "dynamic-ntk";
  EXPECT_EQ(open_eval_checkpoint(step_dir, {}, dynamic).config.model.position.rope.scaling.kind, RopeScalingKind::dynamic_ntk);

  // The loaded weights are the checkpoint's.
  auto backend = make_backend(DeviceChoice::cpu, "float", 1);
  auto model = load_eval_model(from_run, *backend);
  const CheckpointData saved = load_checkpoint(step_dir, model->layout(), true);
  EXPECT_EQ(model->parameters_to_host(), saved.params);

  // Refusals: non-model keys, bad values, RoPE scaling on another encoding, missing pieces.
  EXPECT_NE(thrown_message<ConfigError>([&] { open_eval_checkpoint(step_dir, {"train.seq_len=64"}); })
                .find("train.seq_len"),
            std::string::npos);
  EXPECT_NE(thrown_message<ConfigError>([&] { open_eval_checkpoint(step_dir, {"model.position.rope.scaling.kind=x"}); })
                .find("model.position.rope.scaling.kind"),
            std::string::npos);
  RopeScalingOverride bad_factor;
  bad_factor.kind = "pi";
  bad_factor.factor = 0.5;
  EXPECT_NE(thrown_message<ConfigError>([&] { open_eval_checkpoint(step_dir, {}, bad_factor); }).find("factor"),
            std::string::npos);
  config.model.position.kind = "pope";
  Trainer(config, TrainerOptions{dir / "pope_run", "", true, 0, {}}).train();
  EXPECT_NE(thrown_message<ConfigError>([&] { open_eval_checkpoint(dir / "pope_run", {}, yarn); }).find("'pope'"),
            std::string::npos);
  EXPECT_NE(thrown_message<CheckpointError>([&] { open_eval_checkpoint(dir / "nowhere", {}); }).find("nowhere"),
            std::string::npos);
  std::filesystem::remove(dir / "rope_run" / "config.json");
  EXPECT_NE(thrown_message<CheckpointError>([&] { open_eval_checkpoint(step_dir, {}); }).find("config.json"),
            std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(EvalReport, CsvRoundTripsAndJsonHasNullForEmptyLengths) {
  EvalReport report;
  report.data = "books/";
  EvalCurve curve;
  curve.label = "rope 256";
  curve.checkpoint = "runs/rope/checkpoints/step_00000100";
  curve.step = 100;
  curve.position = "rope+yarn(s=4 a=1 b=32)";
  curve.train_length = 256;
  LengthResult a;
  a.length = 256;
  a.windows = 10;
  a.tokens = 2560;
  a.nll_sum = 2560 * 3.25;
  a.tail_tokens = 2560;
  a.tail_nll_sum = 2560 * 3.25;
  a.batch = 10;
  a.seconds = 0.5;
  LengthResult empty;
  empty.length = 4096;
  curve.results = {a, empty};
  report.curves = {curve, curve};
  report.curves[1].label = "pope";

  ScratchDir dir;
  write_file_atomic(dir / "r.csv", format_csv(report));
  const auto curves = read_curves_csv(dir / "r.csv");
  ASSERT_EQ(curves.size(), 2u);
  EXPECT_EQ(curves[0].label, "rope 256");
  EXPECT_EQ(curves[1].label, "pope");
  EXPECT_EQ(curves[0].position, curve.position);
  EXPECT_EQ(curves[0].train_length, 256);
  ASSERT_EQ(curves[0].results.size(), 2u);
  EXPECT_DOUBLE_EQ(curves[0].results[0].perplexity(), std::exp(3.25));
  EXPECT_EQ(curves[0].results[0].windows, 10u);
  EXPECT_TRUE(std::isnan(curves[0].results[1].perplexity()));

  const nlohmann::json json = report_to_json(report);
  EXPECT_TRUE(json["curves"][0]["results"][1]["perplexity"].is_null());
  EXPECT_DOUBLE_EQ(json["curves"][0]["results"][0]["nll"].get<double>(), 3.25);

  write_file_atomic(dir / "bad.csv", "length,ppl\n1,2\n");
  EXPECT_NE(thrown_message<DataError>([&] { read_curves_csv(dir / "bad.csv"); }).find("bad.csv line 1"),
            std::string::npos);
  write_file_atomic(dir / "short.csv", format_csv(report) + "x,y\n");
  EXPECT_NE(thrown_message<DataError>([&] { read_curves_csv(dir / "short.csv"); }).find("line 6"),
            std::string::npos);
}

TEST(EvalReport, PlotWritesAPngOrSaysGnuplotIsMissing) {
  ScratchDir dir;
  EvalCurve curve;
  curve.label = "pope_run";
  curve.train_length = 16;
  for (int L : {16, 32, 64}) {
    LengthResult r;
    r.length = L;
    r.windows = 1;
    r.tokens = L;
    r.nll_sum = L * (2.0 + L / 64.0);
    curve.results.push_back(r);
  }
  if (!gnuplot_available()) {
    EXPECT_NE(thrown_message<std::runtime_error>([&] { plot_curves({curve}, dir / "p.png"); }).find("gnuplot"),
              std::string::npos);
    GTEST_SKIP() << "gnuplot is not installed: only the error was checked";
  }
  plot_curves({curve}, dir / "p.png");
  const auto bytes = pope::testing::read_bytes(dir / "p.png");
  ASSERT_GT(bytes.size(), 8u);
  EXPECT_EQ(bytes[1], 'P');
  EXPECT_EQ(bytes[2], 'N');
  EXPECT_EQ(bytes[3], 'G');
  EXPECT_FALSE(std::filesystem::exists(dir / "p.png.tmp.png"));
}
