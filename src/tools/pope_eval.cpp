// pope-eval: evaluate checkpoints. Modes: perplexity versus window length (--lengths),
// plotting a CSV written earlier (--plot-csv), test-set accuracy of the indirect-indexing task
// (--task indirect_indexing), the paper's zero-shot tasks (--task lambada|hellaswag|piqa|
// arc_easy|blimp|cbt, --task zero-shot-suite) and PJ-RoPE diagnostics (--diagnostics). The work
// lives in the library (pope/eval.hpp, pope/indirect_indexing.hpp, pope/zero_shot.hpp,
// pope/pj_diagnostics.hpp); this file parses flags, dispatches and maps errors to exit codes.
// Exit codes: 0 done, 1 data/checkpoint/runtime error, 2 usage or config error.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <limits>

#include "pope/checkpoint.hpp"
#include "pope/config.hpp"
#include "pope/data.hpp"
#include "pope/eval.hpp"
#include "pope/indirect_indexing.hpp"
#include "pope/model.hpp"
#include "pope/pj_diagnostics.hpp"
#include "pope/tokenizer.hpp"
#include "pope/zero_shot.hpp"
#include "tools/console_log.hpp"
#include "tools/enum_option.hpp"
#include "tools/number_checks.hpp"
#include "tools/output_file.hpp"
#include "tools/version.hpp"

namespace {

constexpr int kExitRuntime = 1;
constexpr int kExitConfig = 2;

struct Options {
  std::vector<std::string> checkpoints, labels, overrides;
  std::string data, lengths, device = "auto", csv, json, plot, plot_csv, task;
  std::string data_dir, labels_file, tokenizer_dir;
  bool diagnostics = false, strict = false;
  // Flags that only some modes read, by name, when given (a mode refuses those it ignores).
  std::vector<std::string> given;
  bool was_given(const std::string& flag) const { return std::find(given.begin(), given.end(), flag) != given.end(); }
  pope::LengthSweepOptions sweep;
  pope::RopeScalingOverride rope;
  int threads = 0, train_len = 0;
  bool quiet = false;
};

// Labels, paths and encodings go into CSV fields, which pope-eval does not quote.
void check_csv_field(const std::string& text, const std::string& what) {
  if (text.find_first_of(",\n\r") != std::string::npos)
    throw pope::ConfigError(what, fmt::format("'{}' contains a comma or line break, which the CSV output cannot "
                                              "hold; rename it or give --label",
                                              text));
}

// The scaling flags reach the config as model.position.rope.scaling.* overrides; a combination
// refused there (--yarn-alpha above the checkpoint's yarn_beta) would otherwise blame only the
// run's config.json.
pope::EvalCheckpoint open_checkpoint(const Options& o, const std::string& path) {
  try {
    return pope::open_eval_checkpoint(path, o.overrides, o.rope);
  } catch (const pope::ConfigError& e) {
    if (!o.rope.any() || e.path().rfind("model.position.rope.scaling.", 0) != 0) throw;
    throw pope::ConfigError("--rope-scaling", fmt::format("{}; --rope-scaling, --rope-factor and --yarn-* override "
                                                          "these keys",
                                                          e.what()));
  }
}

// A forward that overflows (a finite but huge weight) gives NaN or infinite losses, which would be
// printed as a table of "-nan" and exit 0: refused, naming the checkpoint and the length.
void require_finite(const pope::LengthResult& r, const std::string& checkpoint) {
  if (r.windows == 0 || (std::isfinite(r.perplexity()) && std::isfinite(r.tail_perplexity()))) return;
  throw std::runtime_error(fmt::format("{}: the mean NLL at length {} is {} (perplexity {}), not a finite number: the "
                                       "model's forward overflows or reads a non-finite value; no results written",
                                       checkpoint, r.length, r.mean_nll(), r.perplexity()));
}

// What the sweep's callback sees of the checkpoint being evaluated.
struct SweepContext {
  std::string label, checkpoint;
  bool quiet = false;
};

// After each length: refuses a non-finite result at once, then reports the length.
void on_length(const pope::LengthResult& r, void* context) {
  const auto& sweep = *static_cast<const SweepContext*>(context);
  require_finite(r, sweep.checkpoint);
  if (sweep.quiet) return;
  if (r.windows == 0) {
    spdlog::warn("{} | length {}: no book holds a window of {} tokens; skipped", sweep.label, r.length, r.length + 1);
    return;
  }
  spdlog::info("{} | length {:>6} | {} windows × {} per forward | ppl {:.3f} | tail ppl {:.3f} | {:.0f} tok/s",
               sweep.label, r.length, r.windows, r.batch, r.perplexity(), r.tail_perplexity(), r.tokens_per_second());
}

// A length L takes a book of at least L + 1 tokens; evaluating when no length fits any book
// would report nothing but NaN.
void require_a_window(const pope::TokenDataset& data, const std::vector<int>& lengths, const std::string& lengths_text,
                      const std::string& data_path) {
  std::size_t longest_book = 0;
  for (const auto& file : data.files()) longest_book = std::max(longest_book, file.size());
  if (std::none_of(lengths.begin(), lengths.end(), [&](int L) { return std::size_t(L) + 1 <= longest_book; }))
    throw pope::ConfigError("--lengths", fmt::format("no length in '{}' fits a window of {}: a length L takes a book "
                                                     "of at least L + 1 tokens, and its longest holds {}",
                                                     lengths_text, data_path, longest_book));
}

void write_outputs(const Options& o, const pope::EvalReport& report) {
  std::cout << pope::format_table(report);
  namespace fs = std::filesystem;
  if (!o.csv.empty()) pope::write_file_atomic(fs::absolute(o.csv), pope::format_csv(report));
  if (!o.json.empty()) pope::write_file_atomic(fs::absolute(o.json), pope::report_to_json(report).dump(2) + "\n");
  if (!o.plot.empty()) pope::plot_curves(report.curves, o.plot, o.train_len);
}

int run_length_sweep(const Options& o) {
  if (o.checkpoints.empty()) throw pope::ConfigError("--checkpoint", "at least one checkpoint is required");
  if (o.data.empty()) throw pope::ConfigError("--data", "a token file or directory of books is required");
  if (!o.labels.empty() && o.labels.size() != o.checkpoints.size())
    throw pope::ConfigError("--label", fmt::format("{} labels for {} checkpoints; give one per --checkpoint or none",
                                                   o.labels.size(), o.checkpoints.size()));
  if (!o.plot.empty() && !pope::gnuplot_available())
    throw pope::ConfigError("--plot", "gnuplot is not installed (Debian: apt-get install gnuplot-nox, see "
                                      "scripts/setup.sh); leave out --plot, write --csv and plot it with "
                                      "scripts/plot_lengths.sh where gnuplot is");
  pope::LengthSweepOptions sweep = o.sweep;
  if (!o.lengths.empty()) sweep.lengths = pope::parse_lengths(o.lengths);

  // Everything that can be refused is checked before the first (possibly long) forward.
  std::vector<pope::EvalCheckpoint> checkpoints;
  int vocab_size = std::numeric_limits<int>::max();
  for (std::size_t i = 0; i < o.checkpoints.size(); ++i) {
    auto checkpoint = open_checkpoint(o, o.checkpoints[i]);
    if (!o.labels.empty()) checkpoint.label = o.labels[i];
    else if (o.rope.any()) checkpoint.label += " " + pope::describe_position(checkpoint.config.model.position);
    check_csv_field(checkpoint.label, "--label");
    check_csv_field(checkpoint.step_dir.string(), "--checkpoint");
    vocab_size = std::min(vocab_size, checkpoint.config.model.vocab_size);
    checkpoints.push_back(std::move(checkpoint));
  }
  // Without --lengths: each checkpoint's training length, the one its validation loss was measured at.
  if (o.lengths.empty()) {
    for (const auto& checkpoint : checkpoints) sweep.lengths.push_back(checkpoint.config.train.seq_len);
    std::sort(sweep.lengths.begin(), sweep.lengths.end());
    sweep.lengths.erase(std::unique(sweep.lengths.begin(), sweep.lengths.end()), sweep.lengths.end());
  }
  const std::string lengths_text =
      o.lengths.empty() ? fmt::format("{} (the training length)", fmt::join(sweep.lengths, ",")) : o.lengths;

  // The books are opened (memory-mapped and checked) once for all checkpoints, against the
  // smallest vocabulary among them.
  const pope::TokenDataset data = pope::TokenDataset::open(o.data, vocab_size);
  // A length longer than every book is reported with 0 windows (a sweep may outgrow short books).
  require_a_window(data, sweep.lengths, lengths_text, o.data);
  auto backend = pope::make_backend(*pope::enum_from_name<pope::DeviceChoice>(o.device), "float", o.threads);

  pope::EvalReport report;
  report.data = o.data;
  report.files = data.files().size();
  report.data_tokens = data.total_tokens();
  report.device = backend->description();
  report.options = sweep;
  spdlog::info("pope-eval: {} | {} book(s), {} tokens | lengths {}", report.device, report.files, report.data_tokens,
               lengths_text);
  for (const auto& checkpoint : checkpoints) {
    auto model = pope::load_eval_model(checkpoint, *backend);
    pope::EvalCurve curve;
    curve.label = checkpoint.label;
    curve.checkpoint = checkpoint.step_dir.string();
    curve.step = checkpoint.step;
    curve.position = pope::describe_position(checkpoint.config.model.position);
    curve.train_length = checkpoint.config.train.seq_len;
    spdlog::info("{}: {} at step {} ({}, trained at {})", curve.label, curve.checkpoint, curve.step, curve.position,
                 curve.train_length);
    SweepContext context{curve.label, curve.checkpoint, o.quiet};
    curve.results = pope::sweep_lengths(*model, data, sweep, on_length, &context);
    report.curves.push_back(std::move(curve));
  }
  write_outputs(o, report);
  return 0;
}

// The one checkpoint of the task and diagnostics modes, loaded on the chosen backend.
struct LoadedCheckpoint {
  pope::EvalCheckpoint checkpoint;
  std::unique_ptr<pope::Backend> backend;
  std::unique_ptr<pope::Model> model;
};

LoadedCheckpoint load_single_checkpoint(const Options& o, const char* mode) {
  if (o.checkpoints.size() != 1)
    throw pope::ConfigError("--checkpoint", fmt::format("{} takes exactly one checkpoint, got {}", mode,
                                                        o.checkpoints.size()));
  LoadedCheckpoint loaded;
  loaded.checkpoint = open_checkpoint(o, o.checkpoints.front());
  loaded.backend = pope::make_backend(*pope::enum_from_name<pope::DeviceChoice>(o.device), "float", o.threads);
  loaded.model = pope::load_eval_model(loaded.checkpoint, *loaded.backend);
  return loaded;
}

// Accuracy on the held-out test split, overall and per shift, with the checkpoint's own task
// settings (the split is drawn from the saved data.indirect_indexing seed).
int run_indirect_indexing(const Options& o) {
  if (!o.data.empty() || !o.lengths.empty())
    throw pope::ConfigError("--task", "the task generates its own test set; it takes no --data or --lengths");
  for (const char* flag : {"--data-dir", "--labels", "--strict", "--tokenizer-dir", "--csv", "--plot", "--plot-csv"})
    if (o.was_given(flag))
      throw pope::ConfigError(flag, "is not read by --task indirect_indexing (it is for the zero-shot tasks or the "
                                    "length sweep)");
  LoadedCheckpoint loaded = load_single_checkpoint(o, "--task indirect_indexing");
  const pope::RunConfig& config = loaded.checkpoint.config;
  if (config.data.kind != pope::DataKind::indirect_indexing)
    throw pope::ConfigError("--task", fmt::format("checkpoint {} was trained on data.kind '{}', not indirect_indexing",
                                                  loaded.checkpoint.step_dir.string(), pope::name_of(config.data.kind)));
  const pope::IndirectIndexingTask task(config.data.indirect_indexing);
  const pope::IndirectIndexingScore score = pope::evaluate_indirect_indexing(
      *loaded.model, task, pope::IndirectSplit::test, config.train.micro_batch_size, config.train.seq_len);
  fmt::print("{} ({}, step {}): test accuracy {:.4f} over {} examples, loss {:.4f}\n",
             loaded.checkpoint.step_dir.string(), pope::describe_position(config.model.position),
             loaded.checkpoint.step, score.accuracy(), score.total.examples, score.mean_loss());
  fmt::print("{:>6} {:>9} {:>9}\n", "shift", "examples", "accuracy");
  for (const auto& [shift, tally] : score.by_shift)
    fmt::print("{:>+6} {:>9} {:>9.4f}\n", shift, tally.examples, tally.accuracy());
  if (!o.json.empty()) {
    nlohmann::json j = pope::score_to_json(score);
    j["checkpoint"] = loaded.checkpoint.step_dir.string();
    j["step"] = loaded.checkpoint.step;
    j["split"] = "test";
    pope::write_file_atomic(std::filesystem::absolute(o.json), j.dump(2) + "\n");
  }
  return 0;
}

// Gates, order masses and energies of every layer and head; with --data, the ΔNLL of leaving
// out each order and each sector, measured on windows of the training length.
int run_diagnostics(const Options& o) {
  for (const char* flag : {"--csv", "--plot", "--plot-csv", "--train-len", "--tail"})
    if (o.was_given(flag))
      throw pope::ConfigError(flag, "is not read by --diagnostics (it belongs to the length sweep); --json writes "
                                    "the diagnostics");
  LoadedCheckpoint loaded = load_single_checkpoint(o, "--diagnostics");
  const pope::RunConfig& config = loaded.checkpoint.config;
  const std::vector<int> lengths = o.lengths.empty() ? std::vector<int>{config.train.seq_len}
                                                     : pope::parse_lengths(o.lengths);
  if (lengths.size() != 1)
    throw pope::ConfigError("--lengths", "--diagnostics takes one length (the lag grid 0..L−1 and the NLL windows)");
  pope::Model& model = *loaded.model;
  const std::vector<float> parameters = model.parameters_to_host();
  pope::PjDiagnostics report = pope::compute_pj_diagnostics(config.model, model.layout(), parameters, lengths[0]);
  if (!o.data.empty()) {
    const pope::TokenDataset data = pope::TokenDataset::open(o.data, config.model.vocab_size);
    require_a_window(data, lengths, o.lengths.empty() ? fmt::format("{} (the training length)", lengths[0]) : o.lengths,
                     o.data);
    pope::LengthSweepOptions sweep = o.sweep;
    sweep.lengths = lengths;
    if (sweep.max_windows == 0) sweep.max_windows = 256;  // each ablation is one such evaluation
    pope::add_pj_ablations(report, config.model, model.layout(), parameters, [&](std::span<const float> values) {
      model.parameters_from_host(values);
      const pope::LengthResult result = pope::sweep_lengths(model, data, sweep, nullptr, nullptr).front();
      require_finite(result, loaded.checkpoint.step_dir.string());
      return result.mean_nll();
    });
    model.parameters_from_host(parameters);
  }
  std::cout << pope::format_pj_diagnostics(report);
  if (!o.json.empty()) pope::write_pj_diagnostics(std::filesystem::absolute(o.json), report);
  return 0;
}

// ---- zero-shot tasks ----------------------------------------------------------------

// Which files the zero-shot mode reads: one task's --data, or every task found in --data-dir.
std::vector<pope::SuiteEntry> zero_shot_entries(const Options& o) {
  const bool suite = o.task == "zero-shot-suite";
  for (const char* flag : {"--lengths", "--tail", "--max-windows", "--plot", "--plot-csv", "--train-len"})
    if (o.was_given(flag))
      throw pope::ConfigError(flag, fmt::format("is not read by --task {} (it belongs to the length sweep)", o.task));
  if (o.diagnostics) throw pope::ConfigError("--task", "choose --task or --diagnostics, not both");
  if (o.checkpoints.empty()) throw pope::ConfigError("--checkpoint", "at least one checkpoint is required");
  if (suite) {
    if (!o.data.empty()) throw pope::ConfigError("--data", "--task zero-shot-suite reads --data-dir DIR, not --data");
    if (o.data_dir.empty()) throw pope::ConfigError("--data-dir", "--task zero-shot-suite needs --data-dir DIR");
    if (o.was_given("--labels"))
      throw pope::ConfigError("--labels", "the suite reads PIQA's valid-labels.lst beside valid.jsonl");
    return pope::find_suite_files(o.data_dir);
  }
  if (!o.data_dir.empty())
    throw pope::ConfigError("--data-dir", "is read by --task zero-shot-suite; --task " + o.task + " reads --data FILE");
  if (o.data.empty())
    throw pope::ConfigError("--data", fmt::format("--task {} needs --data: {}", o.task,
                                                  pope::task_definition(*pope::task_from_name(o.task)).layout));
  if (o.was_given("--labels") && o.task != "piqa") throw pope::ConfigError("--labels", "is read by --task piqa only");
  return {{o.task, *pope::task_from_name(o.task), o.data}};
}

void print_task_progress(const std::string& label, const pope::TaskResult& r) {
  std::string metrics;
  for (const pope::MetricValue& m : r.metrics) metrics += fmt::format(" | {} {:.4f}", m.name, m.value);
  spdlog::info("{} | {}: {} examples, {} skipped{} | {:.0f} tok/s ({} forwards)", label, r.name, r.examples.size(),
               r.skipped.size(), metrics, r.stats.tokens_per_second(), r.stats.forwards);
}

// Every task file is read and every checkpoint opened before the first forward; then each
// checkpoint scores every task: one row per checkpoint.
int run_zero_shot(const Options& o) {
  const std::vector<pope::SuiteEntry> entries = zero_shot_entries(o);
  if (!o.labels.empty() && o.labels.size() != o.checkpoints.size())
    throw pope::ConfigError("--label", fmt::format("{} labels for {} checkpoints; give one per --checkpoint or none",
                                                   o.labels.size(), o.checkpoints.size()));
  std::vector<pope::TaskData> tasks;
  for (const pope::SuiteEntry& entry : entries) {
    tasks.push_back(pope::read_task(entry.task, entry.path, o.labels_file));
    if (entries.size() > 1) tasks.back().name = entry.name;
  }
  std::vector<pope::EvalCheckpoint> checkpoints;
  for (std::size_t i = 0; i < o.checkpoints.size(); ++i) {
    checkpoints.push_back(open_checkpoint(o, o.checkpoints[i]));
    if (!o.labels.empty()) checkpoints.back().label = o.labels[i];
  }
  const pope::Gpt2Tokenizer tokenizer = pope::Gpt2Tokenizer::load_default(o.tokenizer_dir);
  const pope::Tokenize tokenize = [&tokenizer](std::string_view text) {
    const std::vector<std::uint16_t> ids = tokenizer.encode(text);
    return std::vector<std::int32_t>(ids.begin(), ids.end());
  };
  pope::ZeroShotOptions options;
  options.max_batch_tokens = o.sweep.max_batch_tokens;
  options.strict = o.strict;
  options.end_of_text = pope::kGpt2EndOfText;
  options.threads = o.threads;
  auto backend = pope::make_backend(*pope::enum_from_name<pope::DeviceChoice>(o.device), "float", o.threads);
  spdlog::info("pope-eval: {} | {} task(s), {} checkpoint(s)", backend->description(), tasks.size(),
               checkpoints.size());

  std::vector<std::vector<pope::TaskRun>> runs(tasks.size());  // per task, per checkpoint
  std::vector<pope::SuiteRow> rows;
  for (const pope::EvalCheckpoint& checkpoint : checkpoints) {
    auto model = pope::load_eval_model(checkpoint, *backend);
    pope::SuiteRow row{checkpoint.label, {}};
    for (std::size_t t = 0; t < tasks.size(); ++t) {
      pope::TaskRun run{checkpoint.label, checkpoint.step_dir.string(), checkpoint.step,
                        pope::describe_position(checkpoint.config.model.position),
                        pope::evaluate_task(*model, tasks[t], tokenize, options)};
      if (!o.quiet) print_task_progress(run.label, run.result);
      row.results.push_back(run.result);
      runs[t].push_back(std::move(run));
    }
    rows.push_back(std::move(row));
  }

  for (const auto& task_runs : runs) std::cout << pope::format_task_table(task_runs) << "\n";
  const bool suite = o.task == "zero-shot-suite";
  if (suite) std::cout << pope::format_suite_table(rows);
  namespace fs = std::filesystem;
  if (!o.json.empty()) {
    nlohmann::json j = suite ? pope::suite_to_json(rows) : nlohmann::json::object();
    nlohmann::json per_task = nlohmann::json::object();
    for (std::size_t t = 0; t < tasks.size(); ++t) per_task[tasks[t].name] = pope::task_runs_to_json(runs[t])["runs"];
    j["tasks"] = per_task;
    j["device"] = backend->description();
    pope::write_file_atomic(fs::absolute(o.json), j.dump(2) + "\n");
  }
  if (!o.csv.empty()) {
    std::string csv;
    for (const auto& task_runs : runs) {
      const std::string part = pope::format_task_csv(task_runs);
      csv += csv.empty() ? part : part.substr(part.find('\n') + 1);  // one header
    }
    pope::write_file_atomic(fs::absolute(o.csv), csv);
  }
  return 0;
}

int run_plot_csv(const Options& o) {
  if (o.plot.empty()) throw pope::ConfigError("--plot", "--plot-csv needs --plot FILE.png");
  if (!o.checkpoints.empty() || !o.data.empty())
    throw pope::ConfigError("--plot-csv", "plots a CSV written earlier; it takes no --checkpoint or --data");
  pope::plot_curves(pope::read_curves_csv(o.plot_csv), o.plot, o.train_len);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  pope::tools::log_to_stderr("pope-eval");
  CLI::App app{"pope-eval: perplexity of checkpoints versus evaluation length (PG-19 protocol of the PoPE paper).\n"
               "Each token file is one book; a window of L tokens predicts L next tokens, windows do not overlap,\n"
               "each book's remainder is dropped; perplexity = exp(mean NLL over all tokens of all windows).\n"
               "--task TASK --data FILE scores the paper's zero-shot tasks as lm-evaluation-harness does (GPT-2\n"
               "tokenizer; acc, acc_norm = argmax of LL per byte, LAMBADA's last-word acc and perplexity, each with\n"
               "its standard error); --task zero-shot-suite --data-dir DIR runs every task found in DIR."};
  std::string footer = "Zero-shot task files (--data):\n";
  for (const pope::TaskDefinition& d : pope::task_definitions())
    footer += fmt::format("  {:<10} {}\n", d.name, d.layout);
  footer += "Suite directory (--data-dir), the first name present per column:\n" + pope::suite_layout();
  app.footer(footer +
             "Exit codes: 0 done, 1 data/checkpoint/runtime error, 2 usage or config error.\n"
             "Example: pope-eval --checkpoint runs/rope --checkpoint runs/pope --data data/pg19_demo \\\n"
             "           --lengths 1024:10240:1024 --csv lengths.csv --plot lengths.png\n"
             "         pope-eval --task hellaswag --data hellaswag_val.jsonl --checkpoint runs/pope --json hs.json");
  Options o;
  app.add_option("--checkpoint", o.checkpoints, "run directory (newest checkpoint) or step directory; repeatable "
                                                "(the books are loaded once for all)");
  app.add_option("--label", o.labels, "curve name per --checkpoint, in order (default: the run directory's name)");
  app.add_option("--data", o.data, "token file (llm.c or nanoGPT .bin), directory of them (one file = one book) or "
                                   "glob");
  app.add_option("--lengths", o.lengths, "FIRST:LAST:STEP (inclusive), a comma-separated list or one length; at "
                                         "most " + std::to_string(pope::kMaxEvalLengths) + " lengths (default: the "
                                         "checkpoints' training length, train.seq_len)");
  app.add_option("--tail", o.sweep.tail, "also report the perplexity of the last N positions of each window")
      ->default_val(1024)
      ->check(pope::tools::integer_check(o.sweep.tail, 1));
  app.add_option("--max-batch-tokens", o.sweep.max_batch_tokens,
                 "tokens per forward at most (windows × length; at least one window). Activation memory grows "
                 "with it: about n_layer × 16 × n_embd values per token (124M in bf16: ≈ 0.3 MB/token)")
      ->default_val(32768)
      ->check(pope::tools::integer_check(o.sweep.max_batch_tokens, 1));
  app.add_option("--max-windows", o.sweep.max_windows, "evaluate N windows per length spread evenly over the data "
                                                       "(the trainer's validation choice with N = eval_batches × "
                                                       "micro_batch_size); 0: all windows")
      ->default_val(0)
      ->check(pope::tools::integer_check(o.sweep.max_windows));
  // Unset flags keep the checkpoint's values: each is read into a plain value and copied into
  // the optional override only when it was given. The values are checked here, with the
  // bounds of their config keys, so that a refusal names the flag and not the run's config.
  std::string rope_kind;
  double rope_factor = 0, yarn_alpha = 0, yarn_beta = 0, yarn_temperature = 0;
  auto* rope_kind_flag =
      app.add_option("--rope-scaling", rope_kind, "override the checkpoint's RoPE scaling (rope checkpoints only)")
          ->check(CLI::IsMember({"none", "pi", "ntk", "dynamic-ntk", "dynamic_ntk", "yarn"}));
  auto* rope_factor_flag =
      app.add_option("--rope-factor", rope_factor, "scaling factor s >= 1 for --rope-scaling pi, ntk and yarn (e.g. 4)")
          ->check(pope::tools::at_least(1));
  auto* yarn_alpha_flag = app.add_option("--yarn-alpha", yarn_alpha, "--rope-scaling yarn: ramp start α (default 1)")
                              ->check(pope::tools::kNonNegative);
  auto* yarn_beta_flag = app.add_option("--yarn-beta", yarn_beta, "--rope-scaling yarn: ramp end β > α (default 32)")
                             ->check(pope::tools::above(0));
  auto* yarn_temperature_flag = app.add_option("--yarn-temperature", yarn_temperature,
                                               "--rope-scaling yarn: q/k multiplier t (default 0: 0.1·ln s + 1)")
                                    ->check(pope::tools::kNonNegative);
  app.add_option("-s,--set", o.overrides, "override a model.* key of the checkpoints' config, e.g. "
                                          "--set model.context_length=2048 (repeatable)");
  app.add_option("--device", o.device, "auto | cpu | cuda")->check(pope::tools::one_of_names<pope::DeviceChoice>());
  app.add_option("--threads", o.threads, "CPU threads (at most " + std::to_string(pope::kMaxThreads) +
                                         "); 0: all cores")
      ->check(pope::tools::threads_check(o.threads));
  app.add_option("--csv", o.csv, "write one row per checkpoint × length")->check(pope::tools::kOutputFile);
  app.add_option("--json", o.json, "write the results and settings as JSON")->check(pope::tools::kOutputFile);
  app.add_option("--plot", o.plot, "write a PNG of perplexity versus length (needs gnuplot)")
      ->check(pope::tools::kOutputFile);
  app.add_option("--plot-csv", o.plot_csv, "plot mode: read a CSV written by --csv (e.g. on another machine) and "
                                           "write --plot; no evaluation");
  app.add_option("--train-len", o.train_len, "plot: mark only this training length (default: each curve's "
                                             "train.seq_len)")
      ->check(pope::tools::integer_check(o.train_len, 0));
  app.add_flag("-q,--quiet", o.quiet, "no progress lines");
  std::vector<std::string> task_names{"indirect_indexing", "zero-shot-suite"};
  for (const pope::TaskDefinition& d : pope::task_definitions()) task_names.emplace_back(d.name);
  app.add_option("--task", o.task, "task mode: indirect_indexing (test-set accuracy, overall and per shift, of a "
                                   "checkpoint trained on the task), a zero-shot task (lambada, hellaswag, piqa, "
                                   "arc_easy, blimp, cbt; --data FILE) or zero-shot-suite (--data-dir DIR); --json "
                                   "writes the results, --csv (zero-shot) one row per example and choice")
      ->check(CLI::IsMember(task_names));
  app.add_option("--data-dir", o.data_dir, "--task zero-shot-suite: the directory holding the task files (names "
                                           "below)");
  app.add_option("--labels", o.labels_file, "--task piqa: the labels file (default: valid-labels.lst beside "
                                            "valid.jsonl)");
  app.add_flag("--strict", o.strict, "zero-shot tasks: an example that would be skipped (e.g. a choice without "
                                     "tokens) is an error instead (by default skips are counted and reported)");
  app.add_option("--tokenizer-dir", o.tokenizer_dir, "zero-shot tasks: directory with encoder.json and vocab.bpe "
                                                     "(default: $POPE_TOKENIZER_DIR, else data/tokenizer in or above "
                                                     "the working directory, else PREFIX/share/pope/tokenizer of an "
                                                     "installed binary, else data/tokenizer above the binary)");
  app.add_flag("--diagnostics", o.diagnostics,
               "PJ-RoPE mode: sector gates, mass per order, top order, energies on the lag grid 0..L−1 (L: --lengths, "
               "default the training length) and affine slopes per layer and head; with --data also leave-one-order-"
               "and leave-one-sector-out ΔNLL on up to --max-windows (default 256) windows of length L; --json "
               "writes it");
  pope::tools::finish_cli(app, "pope-eval");
  try {
    app.parse(argc, argv);
    // A scaling parameter is only read by the kinds named in its help; given for another kind
    // (or without --rope-scaling, keeping the checkpoint's kind) it would change nothing.
    const bool fixed_factor = rope_kind == "pi" || rope_kind == "ntk" || rope_kind == "yarn";
    if (*rope_factor_flag && !fixed_factor)
      throw CLI::ValidationError("--rope-factor", rope_kind.empty() ? "needs --rope-scaling pi, ntk or yarn"
                                                                    : "is not used by --rope-scaling " + rope_kind +
                                                                          "; it sets the factor of pi, ntk and yarn");
    for (const auto* yarn_flag : {yarn_alpha_flag, yarn_beta_flag, yarn_temperature_flag})
      if (*yarn_flag && rope_kind != "yarn")
        throw CLI::ValidationError(yarn_flag->get_name(), rope_kind.empty()
                                                              ? "needs --rope-scaling yarn"
                                                              : "is not used by --rope-scaling " + rope_kind +
                                                                    "; it sets a parameter of yarn");
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : kExitConfig;
  }
  for (const char* flag : {"--lengths", "--tail", "--max-windows", "--plot", "--plot-csv", "--train-len", "--data-dir",
                           "--labels", "--strict", "--tokenizer-dir", "--csv"})
    if (app.get_option(flag)->count() > 0) o.given.emplace_back(flag);
  if (*rope_kind_flag) o.rope.kind = rope_kind;
  if (*rope_factor_flag) o.rope.factor = rope_factor;
  if (*yarn_alpha_flag) o.rope.yarn_alpha = yarn_alpha;
  if (*yarn_beta_flag) o.rope.yarn_beta = yarn_beta;
  if (*yarn_temperature_flag) o.rope.yarn_temperature = yarn_temperature;

  try {
    if (!o.task.empty() && o.diagnostics) throw pope::ConfigError("--task", "choose --task or --diagnostics, not both");
    if (o.task.empty())
      for (const char* flag : {"--data-dir", "--labels", "--strict", "--tokenizer-dir"})
        if (o.was_given(flag)) throw pope::ConfigError(flag, "is read by the zero-shot tasks (--task) only");
    if (o.task == "indirect_indexing") return run_indirect_indexing(o);
    if (!o.task.empty()) return run_zero_shot(o);
    if (o.diagnostics) return run_diagnostics(o);
    return o.plot_csv.empty() ? run_length_sweep(o) : run_plot_csv(o);
  } catch (const pope::ConfigError& e) {
    spdlog::error("config error: {}", e.what());
    return kExitConfig;
  } catch (const std::bad_alloc&) {
    spdlog::error("{}", pope::tools::kOutOfMemory);
    return kExitRuntime;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return kExitRuntime;
  }
}
