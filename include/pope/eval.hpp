// Evaluation of trained checkpoints (pope-eval). Each mode is its own set of functions so
// that the CLI stays a thin dispatcher:
//   checkpoints  open_eval_checkpoint / load_eval_model   (eval_checkpoint.cpp)
//   lengths      perplexity versus window length         (eval_lengths.cpp)
//   reports      console table, CSV, JSON, PNG plot       (eval_report.cpp, eval_plot.cpp)
//
// Window protocol (the PoPE paper's PG-19 protocol): every token file is one book; a length-L window
// holds L inputs and the L next tokens as targets, window w of a file covering tokens
// [w·L, w·L + L + 1) — the trainer's validation windows (SequentialWindowSampler), so that
// an evaluation at L = train.seq_len reproduces the logged validation loss. Each book's
// remainder is dropped. Perplexity = exp(Σ NLL / Σ tokens) over all windows of all books.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pope/backend.hpp"
#include "pope/config.hpp"
#include "pope/data.hpp"
#include "pope/model.hpp"

namespace pope {

// ---- checkpoints -------------------------------------------------------------------

// A checkpoint to evaluate and the config it is evaluated with.
struct EvalCheckpoint {
  std::filesystem::path given;      // as named on the command line
  std::filesystem::path step_dir;   // <run>/checkpoints/step_N
  std::filesystem::path config_file;  // <run>/config.json
  long step = 0;
  std::string label;                // curve name: the run directory's name unless set
  RunConfig config;                 // the run's resolved config with the evaluation overrides
};

// RoPE scaling for evaluation (--rope-scaling and friends); unset fields keep the checkpoint's.
struct RopeScalingOverride {
  std::optional<std::string> kind;  // none | pi | ntk | dynamic-ntk (or dynamic_ntk) | yarn
  std::optional<double> factor, yarn_alpha, yarn_beta, yarn_temperature;
  bool any() const { return kind || factor || yarn_alpha || yarn_beta || yarn_temperature; }
  // "model.position.rope.scaling.<key>=<value>" assignments for apply_override.
  std::vector<std::string> assignments() const;
};

// `path` is a run directory (its newest checkpoint) or a step directory; the config is the
// run's config.json. `overrides` are "model.…=value" assignments (other sections do not
// affect evaluation and are refused). A RoPE scaling override on a checkpoint whose encoding
// is not rope is a ConfigError naming the checkpoint. Throws CheckpointError, ConfigError.
EvalCheckpoint open_eval_checkpoint(const std::filesystem::path& path, const std::vector<std::string>& overrides,
                                    const RopeScalingOverride& rope_scaling = {});

// Builds the model on `backend` and loads the checkpoint's weights (optimizer state unread).
std::unique_ptr<Model> load_eval_model(const EvalCheckpoint& checkpoint, Backend& backend);

// Short text of the encoding and its scaling for reports, e.g. "rope+yarn(s=4)" or "pope".
std::string describe_position(const PositionConfig& position);

// ---- perplexity versus length ------------------------------------------------------

// The most lengths one --lengths value may give.
inline constexpr int kMaxEvalLengths = 1024;

// "1024:10240:1024" (first:last:step, inclusive), "512,1024,4096" or one number. Every
// length ≥ 1, strictly increasing, at most kMaxEvalLengths of them. Throws ConfigError
// naming "--lengths".
std::vector<int> parse_lengths(const std::string& spec);

struct LengthSweepOptions {
  std::vector<int> lengths;
  int tail = 1024;                        // also report the last `tail` positions of each window
  std::int64_t max_batch_tokens = 32768;  // B·L per forward at most (at least one window)
  std::uint64_t max_windows = 0;          // 0: every window; N: N windows spread evenly (the
                                          // trainer's validation choice, see spread_window_index)
};

// Windows per forward for `windows` windows of `length` tokens: the fewest forwards allowed
// by max_batch_tokens, then the windows shared evenly between them (the last forward is
// padded with masked rows, so one activation size serves the whole length).
int windows_per_forward(std::uint64_t windows, int length, std::int64_t max_batch_tokens);

struct LengthResult {
  int length = 0;
  std::uint64_t windows = 0;
  std::int64_t tokens = 0;        // predicted tokens = windows · length
  double nll_sum = 0.0;
  std::int64_t tail_tokens = 0;   // windows · min(length, tail)
  double tail_nll_sum = 0.0;
  int batch = 0;                  // windows per forward
  double seconds = 0.0;           // forward time, data copies included

  double mean_nll() const;
  double perplexity() const;
  double tail_mean_nll() const;
  double tail_perplexity() const;
  double tokens_per_second() const;
};

// Progress callback, called after each length.
using LengthProgress = void (*)(const LengthResult& result, void* context);

// Evaluates `model` (forward only, no gradients) at every length. A length with no window in
// any file is reported with windows = 0 (perplexity NaN) rather than failing the sweep.
std::vector<LengthResult> sweep_lengths(Model& model, const TokenDataset& data, const LengthSweepOptions& options,
                                        LengthProgress progress = nullptr, void* progress_context = nullptr);

// ---- reports -----------------------------------------------------------------------

struct EvalCurve {
  std::string label;
  std::string checkpoint;         // step directory
  long step = 0;
  std::string position;           // describe_position
  int train_length = 0;           // train.seq_len of the run (the length it was trained at)
  std::vector<LengthResult> results;
};

struct EvalReport {
  std::string data;               // --data as given
  std::size_t files = 0;
  std::size_t data_tokens = 0;
  std::string device;             // backend description
  LengthSweepOptions options;
  std::vector<EvalCurve> curves;
};

std::string format_table(const EvalReport& report);
std::string format_csv(const EvalReport& report);
nlohmann::json report_to_json(const EvalReport& report);
// (Files are written with write_file_atomic from checkpoint.hpp.)

// Reads the curves (label, train_length, per-length results) back from a CSV written by
// format_csv, e.g. one computed on another machine. Throws DataError naming the file and line.
std::vector<EvalCurve> read_curves_csv(const std::filesystem::path& path);

// Whether a gnuplot executable is on PATH (pope-eval checks before a long sweep).
bool gnuplot_available();

// Perplexity versus length, one curve per entry, log-scale y, a dashed vertical line at each
// training length (the curves' train_length, or only `train_length` when > 0), written by
// gnuplot (pngcairo) to `png`. Throws std::runtime_error when gnuplot is missing or fails.
void plot_curves(const std::vector<EvalCurve>& curves, const std::filesystem::path& png, int train_length = 0);

}  // namespace pope
