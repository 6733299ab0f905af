#include "pope/train.hpp"

#include <signal.h>

#include <fmt/format.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "checkpoint/run_lock.hpp"
#include "config/bounded_json.hpp"
#include "pope/distributed.hpp"
#include "pope/sample.hpp"
#include "pope/train_step.hpp"
#include "runtime/delta_bounds.hpp"
#include "runtime/model_options.hpp"
#include "runtime/progress.hpp"
#include "runtime/run_inputs.hpp"

namespace pope {

namespace {

std::atomic<int> g_stop_signal{0};

extern "C" void handle_stop_signal(int signal_number) { Trainer::request_stop(signal_number); }

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The log pattern's %*: wall time since the trainer started, e.g. "+3m05s".
class ElapsedFlag : public spdlog::custom_flag_formatter {
 public:
  explicit ElapsedFlag(Clock::time_point start) : start_(start) {}
  void format(const spdlog::details::log_msg&, const std::tm&, spdlog::memory_buf_t& dest) override {
    const std::string text = fmt::format("+{}", format_duration(seconds_since(start_)));
    dest.append(text.data(), text.data() + text.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<ElapsedFlag>(start_); }

 private:
  Clock::time_point start_;
};

}  // namespace

void Trainer::request_stop(int signal_number) { g_stop_signal.store(signal_number); }

void Trainer::install_signal_handlers() {
  std::signal(SIGINT, handle_stop_signal);
  std::signal(SIGTERM, handle_stop_signal);
  // A closed terminal or a dropped ssh session stops the run as SIGTERM does, unless started
  // under nohup (SIGHUP already ignored), which asks for the run to go on.
  struct sigaction hangup {};
  if (::sigaction(SIGHUP, nullptr, &hangup) == 0 && hangup.sa_handler != SIG_IGN) std::signal(SIGHUP, handle_stop_signal);
}

Trainer::Trainer(RunConfig config, TrainerOptions options, std::unique_ptr<Backend> backend,
                 std::unique_ptr<Communicator> communicator)
    : config_(std::move(config)),
      options_(std::move(options)),
      backend_(std::move(backend)),
      communicator_(std::move(communicator)) {
  if (!communicator_) communicator_ = std::make_unique<SingleProcessCommunicator>();
  if (communicator_->size() > 1 && !backend_)
    throw std::invalid_argument("Trainer: a communicator of several ranks needs the backend it was made for");
  validate(config_);
  const bool task = config_.data.kind == DataKind::indirect_indexing;
  if (!task) require_train_data(config_);
  run_dir_ = options_.run_dir;
  if (run_dir_.empty()) throw std::invalid_argument("Trainer needs a run directory");

  // Rank 0 owns the run directory and claims it before anything else, the resume decision
  // included: a second process on it would delete this one's checkpoint in progress as a
  // leftover and interleave its metrics.jsonl.
  if (is_root()) {
    std::error_code ec;
    std::filesystem::create_directories(run_dir_, ec);
    if (ec)
      throw ConfigError("--out", fmt::format("cannot create the run directory {}: {}", run_dir_.string(), ec.message()));
    try {
      run_lock_ = std::make_unique<RunLock>(run_dir_);
    } catch (const RunLockError& error) {
      throw ConfigError("--out", error.what());
    }
  }

  // Decide what to resume from before writing anything in the run directory.
  check_run_records(run_dir_);
  const std::optional<std::filesystem::path> resume_from = resume_source(run_dir_, options_.resume);

  // Rank 0 writes the run log; the other ranks print warnings and errors only, tagged with
  // their rank.
  auto console = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  std::shared_ptr<spdlog::logger> logger;
  if (is_root()) {
    auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>((run_dir_ / "train.log").string());
    logger = std::make_shared<spdlog::logger>("pope-train", spdlog::sinks_init_list{console, file});
    // spdlog reports a failed write (a full disk) to this handler and carries on: keep the first
    // message for check_log_writes, and stop writing the file. Throwing here could escape a noexcept.
    logger->set_error_handler([file, error = log_error_, path = (run_dir_ / "train.log").string()](
                                  const std::string& message) {
      if (error->empty()) *error = fmt::format("cannot write {}: {}", path, message);
      file->set_level(spdlog::level::off);
    });
    if (options_.quiet) console->set_level(spdlog::level::warn);
  } else {
    logger = std::make_shared<spdlog::logger>("pope-train", console);
    logger->set_level(spdlog::level::warn);
  }
  auto formatter = std::make_unique<spdlog::pattern_formatter>();
  const std::string tag = communicator_->size() > 1 ? fmt::format("rank {}: ", communicator_->rank())
                          : options_.run_name.empty() ? std::string()
                                                      : options_.run_name + ": ";
  formatter->add_flag<ElapsedFlag>('*', Clock::now()).set_pattern("[%Y-%m-%d %H:%M:%S %*] %^%l%$ " + tag + "%v");
  logger->set_formatter(std::move(formatter));
  logger_ = logger;
  // The default logger too: an error that ends the run, logged by pope-train's main after the
  // trainer is gone, then reaches train.log as well as the console. Every line is flushed, the
  // file sink outliving the trainer.
  logger->flush_on(spdlog::level::trace);
  if (options_.run_name.empty()) spdlog::set_default_logger(logger);

  if (task) {
    task_ = std::make_unique<IndirectIndexingTask>(config_.data.indirect_indexing);
  } else {
    train_data_ = std::make_unique<TokenDataset>(open_token_data("data.train", config_.data.train, config_.model.vocab_size));
    train_sampler_ = std::make_unique<RandomWindowSampler>(*train_data_, config_.train.seq_len, config_.train.seed);
  }
  if (!task && !config_.data.val.empty()) {
    val_data_ = std::make_unique<TokenDataset>(open_token_data("data.val", config_.data.val, config_.model.vocab_size));
    val_sampler_ = std::make_unique<SequentialWindowSampler>(*val_data_, config_.train.seq_len);
    check_validation_windows(*val_sampler_, config_);
  }

  if (!backend_) backend_ = make_backend(config_.train.device, "float", config_.train.threads);
  const bool shard_optimizer = config_.train.zero_stage == 1 && communicator_->size() > 1;
  model_ = std::make_unique<Model>(config_.model, *backend_, shard_optimizer ? communicator_->size() : 1);
  apply_model_options(*model_, config_);
  optimizer_ = std::make_unique<AdamW>(*model_, config_.optim, shard_optimizer ? communicator_.get() : nullptr);
  prepare_samples();
  state_.config_hash = config_hash(config_);
  state_.rng = Rng(config_.train.seed).state();
  if (resume_from) {
    restore(*resume_from);
  } else {
    // --resume auto after a crash before the first checkpoint: every logged step is taken again.
    if (options_.resume == "auto") drop_metrics_from(0);
    if (!options_.init_from.empty()) {
      initialize_from(options_.init_from);
    } else {
      model_->initialize(config_.train.seed);
    }
  }
  if (is_root()) {
    // After every other start-up check (a refused start leaves no checkpoints/), before the first step.
    if (options_.write_checkpoints) create_checkpoint_directory(run_dir_);
    write_file_atomic(run_dir_ / "config.json", config_to_json(config_).dump(2) + "\n");
  }

  logger->info("pope-train: {} | {} parameters ({:.1f}M) | position {} | run dir {}", backend_->description(),
               model_->parameter_count(), double(model_->parameter_count()) / 1e6, config_.model.position.kind,
               run_dir_.string());
  if (task_) {
    const IndirectIndexingConfig& ii = config_.data.indirect_indexing;
    logger->info("data: indirect indexing (seed {}), {} / {} / {} train / val / test examples, strings of {}-{} "
                 "letters, shifts up to ±{}",
                 ii.seed, ii.train_size, ii.val_size, ii.test_size, ii.min_len, ii.max_len, ii.max_shift);
  } else {
    logger->info("data: {} training tokens in {} file(s){}", train_data_->total_tokens(), train_data_->files().size(),
                 val_data_ ? fmt::format(", {} validation tokens", val_data_->total_tokens()) : "");
  }
  if (communicator_->size() > 1) {
    const int ranks = communicator_->size();
    logger->info("data parallel: {} ranks, global batch {} = micro-batch {} × accumulation {} × {} ranks", ranks,
                 config_.train.batch_size, config_.train.micro_batch_size, config_.grad_accumulation(ranks), ranks);
    const double state_mib = double(optimizer_->state_bytes()) / double(1 << 20);
    const bool sharded = optimizer_->sharded();
    const std::string reduction =
        config_.train.ddp_bucket_mb > 0
            ? fmt::format("{} in buckets of {} MiB overlapped with the backward",
                          sharded ? "reduced to their shard's rank" : "all-reduce", config_.train.ddp_bucket_mb)
            : std::string(sharded ? "one reduce-scatter after the backward" : "one all-reduce after the backward");
    logger->info("gradients: {}; optimizer state {:.1f} MiB per rank{}", reduction, state_mib,
                 sharded ? fmt::format(" (ZeRO-1: 1/{} of {:.1f} MiB)", ranks, state_mib * ranks)
                                       : std::string(" (not sharded)"));
  }
  check_log_writes();
}

Trainer::~Trainer() = default;

void Trainer::restore(const std::filesystem::path& checkpoint) {
  const std::filesystem::path step_dir = checkpoint_step_directory(checkpoint);
  const std::optional<RunConfig> saved = saved_run_config(checkpoint);
  checked_resume_state(step_dir, saved, config_);
  CheckpointData data = load_checkpoint(step_dir, model_->layout());
  if (data.adam_m.empty())
    throw CheckpointError(fmt::format("{} holds weights only (no optimizer.safetensors), so the run cannot be "
                                      "continued exactly; start a new run from its weights with --init-from",
                                      step_dir.string()));
  model_->parameters_from_host(data.params);
  optimizer_->moments_from_host(data.adam_m, data.adam_v);
  state_ = data.state;
  last_checkpoint_ = step_dir;
  auto& logger = *std::static_pointer_cast<spdlog::logger>(logger_);
  logger.info("resumed from {} at step {}", step_dir.string(), state_.step);
  if (saved) {
    const std::string change =
        describe_schedule_change(config_.optim, state_.step, saved->train.steps, config_.train.steps);
    if (!change.empty()) logger.warn("{}", change);
  }
  drop_metrics_from(state_.step + 1);
}

// Metrics logged after the resumed step belong to a future that is about to be replayed: the
// file is rewritten atomically without them (and without a line torn by a crash).
void Trainer::drop_metrics_from(long first_replayed_step) {
  const auto metrics = run_dir_ / "metrics.jsonl";
  if (!is_root() || !std::filesystem::exists(metrics)) return;
  std::ifstream in(metrics);
  std::ostringstream kept;
  long dropped = 0;
  for (std::string line; std::getline(in, line);) {
    const auto record = parse_json(line, nullptr, false);
    if (!record.is_discarded() && record.is_object() && record.value("step", 0L) < first_replayed_step)
      kept << line << '\n';
    else
      ++dropped;
  }
  if (dropped == 0) return;
  write_file_atomic(metrics, kept.str());
  std::static_pointer_cast<spdlog::logger>(logger_)->info(
      "metrics.jsonl: dropped {} record(s) from step {} on, which this run takes again", dropped, first_replayed_step);
}

// Fine-tuning: weights only. The checkpoint's own config is not consulted; this run's config
// decides everything else, and the parameter layouts must agree tensor by tensor.
void Trainer::initialize_from(const std::filesystem::path& checkpoint) {
  CheckpointData data;
  try {
    data = load_checkpoint(checkpoint, model_->layout(), /*weights_only=*/true);
  } catch (const CheckpointError& error) {
    throw CheckpointError(fmt::format("--init-from {}: {}", checkpoint.string(), error.what()));
  }
  model_->parameters_from_host(data.params);
  std::static_pointer_cast<spdlog::logger>(logger_)->info(
      "initialised from {} (weights only: optimizer state, step and schedule start fresh)", checkpoint.string());
}

void Trainer::append_metrics(const nlohmann::json& record) {
  if (!is_root()) return;
  check_log_writes();
  const std::filesystem::path path = run_dir_ / "metrics.jsonl";
  std::ofstream out(path, std::ios::app);
  out << record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';  // samples may hold any bytes
  out.close();  // the record reaches the file here: a full disk fails the close, not the <<
  if (!out) throw std::runtime_error(fmt::format("cannot append to {}: {}", path.string(), std::strerror(errno)));
}

void Trainer::check_log_writes() const {
  if (!log_error_->empty()) throw std::runtime_error(*log_error_);
}

// Rank 0 writes (every rank holds the same weights, and the same moments unless they are
// sharded); the others wait at the barrier, so that no rank runs ahead of, or exits before, a
// complete checkpoint. Sharded moments are gathered first, every rank taking part, so that
// the checkpoint holds the whole state in the one format any number of ranks resumes from.
void Trainer::save() {
  optimizer_->gather_master_weights();
  check_ranks_agree();
  CheckpointData data;
  if (is_root() || optimizer_->sharded()) {
    data.adam_m = optimizer_->first_moment_to_host();
    data.adam_v = optimizer_->second_moment_to_host();
  }
  if (is_root()) {
    data.state = state_;
    data.params = model_->parameters_to_host();
    last_checkpoint_ = save_checkpoint(run_dir_, model_->layout(), data, config_.train.keep_checkpoints);
    std::static_pointer_cast<spdlog::logger>(logger_)->info("checkpoint {}", last_checkpoint_.string());
  }
  communicator_->barrier();
}

// Data-parallel ranks apply identical updates, so their weights must stay bit-identical;
// a difference means a broken reduction and would make rank 0's checkpoint a lie. Each
// rank's Σw² goes into its own entry of a zeroed vector, and the sum over ranks (adding
// zeros is exact) gives every rank all of them.
void Trainer::check_ranks_agree() {
  const int ranks = communicator_->size();
  if (ranks == 1) return;
  std::vector<double> fingerprints(std::size_t(ranks), 0.0);
  fingerprints[std::size_t(communicator_->rank())] = backend_->sum_of_squares(model_->parameters());
  const OwnedTensor shared = allocate_tensor(*backend_, {ranks}, DType::f64);
  backend_->copy_from_host(shared.tensor, fingerprints.data());
  communicator_->all_reduce_sum(shared.tensor);
  const std::unique_ptr<Fence> reduced = backend_->make_fence();
  reduced->record();
  communicator_->wait(*reduced);
  backend_->copy_to_host(fingerprints.data(), shared.tensor);
  for (int r = 1; r < ranks; ++r) {
    if (fingerprints[std::size_t(r)] != fingerprints[0])
      throw CommunicatorError(fmt::format("step {}: the weights of rank {} differ from rank 0's (sum of squares {} vs "
                                          "{}); data-parallel ranks must stay identical",
                                          state_.step, r, fingerprints[std::size_t(r)], fingerprints[0]));
  }
}

double Trainer::evaluate() { return compute_validation().loss; }

// Until they are timed: an evaluation's forwards at a third of a training step's forward and
// backward per row, a checkpoint's 12 bytes per parameter (weights and two moments, fp32)
// at 500 MB/s (a 774M checkpoint takes about 20 s).
ProgressCosts Trainer::estimated_costs() const {
  ProgressCosts costs;
  const double B = config_.train.micro_batch_size;
  const double rows = task_ ? double(config_.data.indirect_indexing.val_size)
                      : val_sampler_ ? std::ceil(double(validation_windows()) / B) * B
                                     : 0.0;
  costs.evaluation_steps_estimate = rows / double(config_.train.batch_size) / 3.0;
  costs.checkpoint_seconds_estimate = 12.0 * double(model_->parameter_count()) / 500e6;
  return costs;
}

std::uint64_t Trainer::validation_windows() const {
  return std::min<std::uint64_t>(val_sampler_->window_count(),
                                 std::uint64_t(config_.train.eval_batches) * std::uint64_t(config_.train.micro_batch_size));
}

Trainer::Validation Trainer::compute_validation() {
  const auto stop = [] { return g_stop_signal.load() != 0; };  // a signal ends a long validation at once
  if (task_) {
    IndirectIndexingScore score = evaluate_indirect_indexing(*model_, *task_, IndirectSplit::val,
                                                             config_.train.micro_batch_size, config_.train.seq_len, stop);
    const bool complete = score.complete;
    return {score.mean_loss(), std::move(score), complete};
  }
  if (!val_sampler_) throw ConfigError("data.val", "no validation data configured");
  const int B = config_.train.micro_batch_size, T = config_.train.seq_len;
  std::vector<std::int32_t> inputs(std::size_t(B) * T), targets(inputs.size());
  // Windows spread evenly over the whole validation stream: the first eval_batches·B windows
  // would only see the beginning of the file, often one or two documents.
  const std::uint64_t windows = val_sampler_->window_count();
  const std::uint64_t wanted = validation_windows();
  LossSum total;
  for (std::uint64_t first = 0; first < wanted; first += std::uint64_t(B)) {
    if (stop()) return {total.mean(), std::nullopt, false};
    const int filled = int(std::min<std::uint64_t>(std::uint64_t(B), wanted - first));
    for (int b = 0; b < filled; ++b) {
      const std::uint64_t window = spread_window_index(first + std::uint64_t(b), wanted, windows);
      val_sampler_->fill(window, 1, inputs.data() + std::size_t(b) * T, targets.data() + std::size_t(b) * T);
    }
    // A short last batch is padded with masked rows (they add nothing to the sum or count)
    // rather than run at another batch size, which would reallocate the model's activations
    // and so make a recorded training step record itself again.
    std::fill(inputs.begin() + std::ptrdiff_t(filled) * T, inputs.end(), 0);
    std::fill(targets.begin() + std::ptrdiff_t(filled) * T, targets.end(), -1);
    const LossSum part = model_->forward(inputs.data(), targets.data(), B, T);
    total.sum += part.sum;
    total.count += part.count;
  }
  return {total.mean(), std::nullopt};
}

void Trainer::prepare_samples() {
  if (config_.train.sample_every <= 0 || !is_root()) return;
  tokenizer_ = std::make_unique<Gpt2Tokenizer>(Gpt2Tokenizer::load_default());
  sample_prompt_ = encode_sample_prompt(config_, *tokenizer_, model_->position());
}

void Trainer::log_sample(long step) {
  const SamplingOptions sampling{.temperature = 1.0, .top_k = 200, .top_p = 1.0};
  std::string text;
  generate(*model_, sample_prompt_, 1, config_.train.sample_tokens, sampling, config_.train.seed + std::uint64_t(step),
           [&](int, const GeneratedToken& token) {
             if (token.id == kGpt2EndOfText) return false;
             text += tokenizer_->token_bytes(std::uint16_t(token.id));
             return true;
           });
  auto& logger = *std::static_pointer_cast<spdlog::logger>(logger_);
  logger.info("step {} | sample: {}{}", step, config_.train.sample_prompt, text);
  append_metrics({{"event", "sample"}, {"step", step}, {"prompt", config_.train.sample_prompt}, {"text", text}});
}

Trainer::Validation Trainer::run_validation(long step) {
  auto& logger = *std::static_pointer_cast<spdlog::logger>(logger_);
  // Before it runs: a long first validation is not a silent one.
  if (task_)
    logger.info("step {} | validating on {} examples", step, config_.data.indirect_indexing.val_size);
  else
    logger.info("step {} | validating on {} windows", step, validation_windows());
  Validation result = compute_validation();
  if (!result.complete) {
    logger.warn("step {} | validation stopped by signal {}; not recorded", step, g_stop_signal.load());
    return result;
  }
  state_.last_val_loss = result.loss;
  nlohmann::json record{{"event", "eval"}, {"step", step}, {"val_loss", result.loss}};
  if (result.score) {
    logger.info("step {} | val loss {:.4f} | val accuracy {:.4f}", step, result.loss, result.score->accuracy());
    record["val_accuracy"] = result.score->accuracy();
    record["val_accuracy_by_shift"] = score_to_json(*result.score)["by_shift"];
  } else {
    logger.info("step {} | val loss {:.4f} | val ppl {:.2f}", step, result.loss, std::exp(result.loss));
  }
  if (const auto delta = delta_bound_shares(*model_)) {
    logger.info("step {} | PoPE δ: {:.2f}% outside [−2π, 0], {:.2f}% on a bound", step, 100 * delta->outside,
                100 * delta->at_bound);
    record["delta_outside"] = delta->outside;
    record["delta_at_bound"] = delta->at_bound;
  }
  append_metrics(record);
  return result;
}

void Trainer::fill_training_rows(std::uint64_t first_sample, std::int32_t* inputs, std::int32_t* targets) const {
  const int B = config_.train.micro_batch_size;
  if (task_)
    task_->fill_training(config_.train.seed, first_sample, B, config_.train.seq_len, inputs, targets);
  else
    train_sampler_->fill(first_sample, B, inputs, targets);
}

// phases: the window's mean per step, if timed.
void Trainer::log_train(long step, double loss, double lr, double grad_norm, double tokens_per_second,
                        std::optional<double> eta_seconds, const std::optional<StepPhases>& phases) {
  if (options_.quiet) return;
  const std::string timing =
      phases ? fmt::format(" | ms/step: fwd+bwd {:.1f}, reduce {:.1f}, update {:.1f}, gather {:.1f}",
                           1e3 * phases->forward_backward, 1e3 * phases->reduction, 1e3 * phases->update,
                           1e3 * phases->gather)
             : std::string();
  std::static_pointer_cast<spdlog::logger>(logger_)->info(
      "step {:>{}}/{} | loss {:.4f} | lr {:.2e} | norm {:.3f} | {:.0f} tok/s | {}{}", step,
      std::to_string(config_.train.steps).size(), config_.train.steps, loss, lr, grad_norm, tokens_per_second,
      format_eta(eta_seconds), timing);
}

TrainingSummary Trainer::train() {
  try {
    return train_steps();
  } catch (...) {
    // The other ranks may be inside a collective that waits for this one: end it for them.
    communicator_->abort();
    throw;
  }
}

TrainingSummary Trainer::train_steps() {
  auto& logger = *std::static_pointer_cast<spdlog::logger>(logger_);
  const TrainConfig& tc = config_.train;
  const int rank = communicator_->rank(), ranks = communicator_->size();
  const int accumulation = config_.grad_accumulation(ranks);
  const int B = tc.micro_batch_size, T = tc.seq_len;
  const double tokens_per_step = double(tc.batch_size) * T;  // all ranks together
  // The loss is the mean over unmasked targets: every position of a token window, one per
  // indirect-indexing row (the target token; the prompt and padding are masked).
  const double targets_per_step = task_ ? double(tc.batch_size) : tokens_per_step;
  const double grad_scale = 1.0 / targets_per_step;  // gradient of the mean loss over the global batch
  std::vector<std::int32_t> inputs(std::size_t(accumulation) * B * T), targets(inputs.size());
  TrainStep train_step(*model_, *optimizer_, TrainStepShape{accumulation, B, T, grad_scale}, true,
                       communicator_.get(), std::int64_t(tc.ddp_bucket_mb * double(1 << 20)));
  train_step.time_phases(tc.phase_timing);

  TrainingSummary summary;
  const auto start = Clock::now();
  const long last_step = options_.stop_at_step > 0 ? std::min(options_.stop_at_step, tc.steps) : tc.steps;
  const ProgressPlan plan{last_step, tc.steps, has_validation(), tc.eval_every, options_.write_checkpoints,
                          tc.checkpoint_every};
  ProgressCosts costs = estimated_costs();
  // Checkpoints, evaluations and samples are timed apart: tok/s and the step time count training only.
  double window_excluded = 0.0;
  const auto timed = [&](auto&& work) {
    const auto begin = Clock::now();
    work();
    const double seconds = seconds_since(begin);
    window_excluded += seconds;
    return seconds;
  };
  if (is_root() && state_.step == 0 && has_validation() && tc.eval_every > 0)
    costs.evaluation_seconds = timed([&] { run_validation(0); });

  auto window_start = Clock::now();
  window_excluded = 0.0;
  long window_steps = 0;
  bool warmup_window = true;  // holds this process's first step: allocations, the CUDA graph's capture
  StepPhases window_phases;  // summed over the window's steps, with train.phase_timing
  // A resumed run's step is already on disk: a call that takes no step writes nothing.
  long last_saved_step = last_checkpoint_.empty() ? -1 : state_.step;
  // One rank's signal stops every rank, at the same step: the ranks' stop votes travel with
  // each step's reduction and are read with its results.
  bool stop_agreed = false;
  const auto stop_requested = [&] { return ranks > 1 ? stop_agreed : g_stop_signal.load() != 0; };

  // The host runs at most one step ahead of the device: step k is enqueued, then step k−1's
  // results are read (waiting only for k−1) while k runs. Steps that log, evaluate or
  // checkpoint are read at once; the others only feed the non-finite guard, one step late.
  const auto reports_at = [&](long step) {
    return step % tc.log_every == 0 || step == 1 || step == tc.steps || step == last_step ||
           (has_validation() && tc.eval_every > 0 && step % tc.eval_every == 0) ||
           (tc.sample_every > 0 && step % tc.sample_every == 0) ||
           (tc.checkpoint_every > 0 && step % tc.checkpoint_every == 0);
  };
  struct Enqueued {
    long step;
    double lr;
  };
  const auto finish = [&](const Enqueued& done) {
    const TrainStepResult result = train_step.result(done.step);
    if (result.stop_votes > 0) stop_agreed = true;
    const double loss = result.loss_sum / targets_per_step;
    summary.last_train_loss = loss;
    ++window_steps;
    if (result.phases) window_phases += *result.phases;

    if (!result.optimizer.applied) {
      ++state_.consecutive_nonfinite;
      logger.warn("step {}: non-finite loss {} or gradient norm {}; update skipped ({} in a row, limit {})", done.step,
                  loss, result.optimizer.grad_norm, state_.consecutive_nonfinite, tc.max_nonfinite_steps);
      append_metrics({{"event", "skip"}, {"step", done.step}, {"loss", std::isfinite(loss) ? loss : -1.0}});
      if (state_.consecutive_nonfinite >= tc.max_nonfinite_steps)
        throw TrainingAborted(fmt::format(
            "{} consecutive steps with a non-finite loss or gradient (last at step {}); stopping. The last good "
            "checkpoint is {}; lower optim.lr or check the data",
            state_.consecutive_nonfinite, done.step,
            last_checkpoint_.empty() ? std::string("(none written)") : last_checkpoint_.string()));
      return;
    }
    state_.consecutive_nonfinite = 0;

    // The checkpoint first: a log line, evaluation or sample that fails after it loses no step.
    if (options_.write_checkpoints &&
        ((tc.checkpoint_every > 0 && done.step % tc.checkpoint_every == 0) || done.step == last_step)) {
      costs.checkpoint_seconds = timed([&] { save(); });
      last_saved_step = done.step;
    }
    if (done.step % tc.log_every == 0 || done.step == 1 || done.step == tc.steps) {
      const double training_seconds = std::max(seconds_since(window_start) - window_excluded, 1e-9);
      const double tokens_per_second = window_steps * tokens_per_step / training_seconds;
      if (!warmup_window) {
        costs.timed_steps += window_steps;
        costs.timed_seconds += training_seconds;
      }
      warmup_window = false;
      std::optional<StepPhases> phases;
      if (result.phases) phases = window_phases / double(window_steps);
      log_train(done.step, loss, done.lr, result.optimizer.grad_norm, tokens_per_second,
                eta_seconds(plan, costs, done.step), phases);
      nlohmann::json record{{"event", "train"},
                            {"step", done.step},
                            {"loss", loss},
                            {"lr", done.lr},
                            {"grad_norm", result.optimizer.grad_norm},
                            {"tokens_per_second", tokens_per_second},
                            {"elapsed_seconds", seconds_since(start)}};
      if (phases)
        record["phase_ms"] = {{"forward_backward", 1e3 * phases->forward_backward},
                              {"reduction", 1e3 * phases->reduction},
                              {"update", 1e3 * phases->update},
                              {"gather", 1e3 * phases->gather}};
      append_metrics(record);
      window_start = Clock::now();
      window_excluded = 0.0;
      window_steps = 0;
      window_phases = StepPhases{};
    }
    if (is_root() && has_validation() && ((tc.eval_every > 0 && done.step % tc.eval_every == 0) || done.step == tc.steps)) {
      Validation validation;
      const double seconds = timed([&] { validation = run_validation(done.step); });
      if (validation.complete) {
        costs.evaluation_seconds = seconds;
        summary.last_val_loss = validation.loss;
        if (validation.score) summary.last_val_accuracy = validation.score->accuracy();
      }
    }
    if (is_root() && tc.sample_every > 0 && done.step % tc.sample_every == 0) timed([&] { log_sample(done.step); });
  };

  std::optional<Enqueued> unread;  // a quiet step whose results have not been read yet
  while (state_.step < last_step && !stop_requested()) {
    for (int micro = 0; micro < accumulation; ++micro) {
      const std::size_t offset = std::size_t(micro) * B * T;
      fill_training_rows(micro_batch_first_sample(state_.samples_consumed, B, accumulation, rank, micro),
                         inputs.data() + offset, targets.data() + offset);
    }
    const double lr = learning_rate(config_.optim, state_.step, tc.steps);
    train_step.enqueue(inputs, targets, state_.step + 1, lr, g_stop_signal.load() != 0);
    state_.samples_consumed += std::uint64_t(tc.batch_size);
    state_.step += 1;
    const Enqueued now{state_.step, lr};
    if (unread) finish(*std::exchange(unread, std::nullopt));
    if (reports_at(now.step)) {
      finish(now);  // reads state_ (checkpoints), which then describes exactly this step
    } else {
      unread = now;
    }
  }
  if (unread) finish(*unread);

  // A rank stopped by another rank's signal reports SIGTERM.
  const int stop_signal = g_stop_signal.load() != 0 ? g_stop_signal.load() : stop_agreed ? SIGTERM : 0;
  summary.reason = stop_signal == SIGINT                            ? StopReason::interrupted
                   : stop_signal == SIGTERM || stop_signal == SIGHUP ? StopReason::terminated
                   : state_.step < tc.steps                         ? StopReason::stop_at_step
                                                                    : StopReason::finished;
  if (options_.write_checkpoints && state_.step != last_saved_step && state_.consecutive_nonfinite == 0) save();
  summary.steps_done = state_.step;
  summary.last_checkpoint = last_checkpoint_;
  summary.seconds = seconds_since(start);
  if (summary.reason == StopReason::interrupted || summary.reason == StopReason::terminated)
    logger.warn("stopped by signal {} after step {}{}", stop_signal, state_.step,
                options_.write_checkpoints ? "; continue with --resume auto" : " (--no-checkpoints: nothing to resume)");
  else if (summary.reason == StopReason::stop_at_step)
    logger.info("stopped after step {} as asked; continue with --resume auto", state_.step);
  logger.info("done: {} steps, {:.1f} s, {}{}{}, checkpoint {}", state_.step, summary.seconds,
              summary.last_train_loss ? fmt::format("final train loss {:.4f}", *summary.last_train_loss)
                                      : std::string("no step taken (the run was already at this step)"),
              summary.last_val_loss ? fmt::format(", val loss {:.4f}", *summary.last_val_loss) : "",
              summary.last_val_accuracy ? fmt::format(", val accuracy {:.4f}", *summary.last_val_accuracy) : "",
              last_checkpoint_.empty() ? std::string("none written") : last_checkpoint_.string());
  append_metrics({{"event", "summary"},
                  {"step", state_.step},
                  {"loss", summary.last_train_loss ? nlohmann::json(*summary.last_train_loss) : nlohmann::json(nullptr)},
                  {"seconds", summary.seconds},
                  {"stopped_by_signal", stop_signal}});
  check_log_writes();
  return summary;
}

}  // namespace pope
