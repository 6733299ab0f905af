// The training loop: data (token files or the indirect-indexing task) → micro-batches with gradient accumulation → AdamW step, with
// logging (console + metrics.jsonl), periodic validation and checkpoints, exact resume,
// graceful stop on SIGINT/SIGTERM/SIGHUP and a guard against non-finite losses. Data-parallel over
// a Communicator's ranks: each rank reads its part of every global batch, gradients are
// summed over the ranks, and rank 0 alone logs, validates and writes the run directory.
#pragma once

#include <atomic>
#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "pope/backend.hpp"
#include "pope/checkpoint.hpp"
#include "pope/communicator.hpp"
#include "pope/config.hpp"
#include "pope/data.hpp"
#include "pope/indirect_indexing.hpp"
#include "pope/model.hpp"
#include "pope/optim.hpp"
#include "pope/tokenizer.hpp"
#include "pope/train_step.hpp"

namespace pope {

class RunLock;              // src/checkpoint/run_lock.hpp
struct ProgressCosts;       // src/runtime/progress.hpp

// Too many consecutive non-finite steps; the last good checkpoint is left as it was.
class TrainingAborted : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct TrainerOptions {
  std::filesystem::path run_dir;   // empty: config.out_dir, else runs/<config file stem>
  std::string resume;              // "" (fresh; refuses a run dir that has checkpoints), "auto", or a path
  bool quiet = false;              // no console progress lines (tests)
  long stop_at_step = 0;           // > 0: checkpoint and stop once this global step is done
                                   // (time-sliced jobs); the LR schedule still spans train.steps
  std::filesystem::path init_from; // non-empty: a fresh run starts from these weights (run or step
                                   // directory) instead of random ones; optimizer moments, step,
                                   // schedule and data position start fresh. Ignored when resuming.
  bool write_checkpoints = true;   // false: none at all, not even the last (benchmark and scaling
                                   // runs, where writing a 774M checkpoint takes longer than the run)
  std::string run_name{};          // non-empty: one of several runs in this process (pope-train
                                   // --seeds): console lines name it, and spdlog's default logger,
                                   // which the runs share, is left alone
};

enum class StopReason { finished, stop_at_step, interrupted, terminated };

struct TrainingSummary {
  StopReason reason = StopReason::finished;
  long steps_done = 0;             // optimizer steps completed in total (incl. before resume)
  std::optional<double> last_train_loss;  // unset when this call took no step (the run was already there)
  std::optional<double> last_val_loss;
  std::optional<double> last_val_accuracy;  // tasks scored by accuracy (indirect indexing)
  std::filesystem::path last_checkpoint;
  double seconds = 0.0;
};

// A problem the trainer's start-up checks find in a run's inputs.
struct InputProblem {
  std::string message;
  bool config = false;  // a config or command-line problem (exit 2), else data or files (exit 1)
};
// Every problem the trainer's start-up checks find, without creating or writing anything, for
// pope-train --dry-run: the run directory, what --resume names (its trainer.json and config
// against `config`, not its tensors) or --init-from, data.train and data.val (opened, headers
// and token ids checked, one window long) or the task's splits, and train.sample_every's
// tokenizer and prompt. Empty: the run would start.
std::vector<InputProblem> check_run_inputs(const RunConfig& config, const TrainerOptions& options);

class Trainer {
 public:
  // Builds backend, model, optimizer and data; resumes when asked. Throws ConfigError,
  // DataError or CheckpointError with messages naming the offending key or file. Without a
  // communicator the run is a single process; with one, `backend` must be the one the
  // communicator was made for. Every rank of a world constructs its Trainer with the same
  // config and options (rank 0 writes the run directory; the others only read it on resume).
  Trainer(RunConfig config, TrainerOptions options, std::unique_ptr<Backend> backend = nullptr,
          std::unique_ptr<Communicator> communicator = nullptr);
  ~Trainer();

  TrainingSummary train();
  // Mean loss over the configured validation windows (requires data.val), or over the
  // indirect-indexing validation split (target tokens only).
  double evaluate();

  Model& model() { return *model_; }
  const RunConfig& config() const { return config_; }
  const std::filesystem::path& run_dir() const { return run_dir_; }
  long step() const { return state_.step; }

  // Set by the signal handler: finish the current step, checkpoint, stop.
  static void request_stop(int signal_number);
  static void install_signal_handlers();

 private:
  struct Validation {
    double loss = 0.0;
    std::optional<IndirectIndexingScore> score;  // indirect indexing only
    bool complete = true;                        // false: a stop signal cut it short
  };
  bool has_validation() const { return task_ != nullptr || val_sampler_ != nullptr; }
  Validation compute_validation();
  // Evaluates, logs and appends the metrics record of `step`.
  Validation run_validation(long step);
  void fill_training_rows(std::uint64_t first_sample, std::int32_t* inputs, std::int32_t* targets) const;
  // What an evaluation and a checkpoint are expected to cost until one is timed.
  ProgressCosts estimated_costs() const;
  // The validation windows an evaluation reads (token data).
  std::uint64_t validation_windows() const;
  // eta_seconds: unset until a step's training time was measured.
  void log_train(long step, double loss, double lr, double grad_norm, double tokens_per_second,
                 std::optional<double> eta_seconds, const std::optional<StepPhases>& phases);
  void append_metrics(const nlohmann::json& record);
  void check_log_writes() const;  // throws the first failed write of train.log
  // train.sample_every: the prompt checked and tokenized when the run starts, a sample logged.
  void prepare_samples();
  void log_sample(long step);
  void save();
  void restore(const std::filesystem::path& checkpoint);
  // Rewrites metrics.jsonl without the records of steps ≥ first_replayed_step (and torn lines).
  void drop_metrics_from(long first_replayed_step);
  void initialize_from(const std::filesystem::path& checkpoint);
  void check_ranks_agree();
  TrainingSummary train_steps();
  bool is_root() const { return communicator_->rank() == 0; }

  RunConfig config_;
  TrainerOptions options_;
  std::filesystem::path run_dir_;
  std::unique_ptr<RunLock> run_lock_;  // rank 0's claim on run_dir_, released last
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Communicator> communicator_;  // after backend_: destroyed before it
  std::unique_ptr<Model> model_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<TokenDataset> train_data_, val_data_;
  std::unique_ptr<RandomWindowSampler> train_sampler_;
  std::unique_ptr<SequentialWindowSampler> val_sampler_;
  std::unique_ptr<IndirectIndexingTask> task_;  // data.kind indirect_indexing: replaces the token data
  std::unique_ptr<Gpt2Tokenizer> tokenizer_;    // train.sample_every > 0 only
  std::vector<std::int32_t> sample_prompt_;
  TrainerState state_;
  std::filesystem::path last_checkpoint_;
  std::shared_ptr<void> logger_;
  std::shared_ptr<std::string> log_error_ = std::make_shared<std::string>();  // set by the logger's error handler
};

}  // namespace pope
