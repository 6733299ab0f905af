// run_train_benchmark: warm up, then time whole optimizer steps the way the Trainer takes
// them (zero gradients, micro-batches × accumulation, clipping + AdamW), synchronising the
// backend before each clock reading so that queued device work is counted.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>

#include "pope/backend.hpp"
#include "pope/bench.hpp"
#include "pope/model.hpp"
#include "pope/optim.hpp"
#include "runtime/bench/bench_batches.hpp"
#include "runtime/bench/bench_median.hpp"
#include "runtime/bench/bench_profiling_backend.hpp"
#include "runtime/model_options.hpp"
#ifdef POPE_HAVE_CUDA
#include "cuda/cuda_memory.hpp"
#endif

namespace pope {

double model_flops_per_token(std::int64_t parameters, const ModelConfig& model, int seq_len) {
  return 6.0 * double(parameters) + 12.0 * model.n_layer * double(seq_len) * model.n_embd;
}

namespace {

using Clock = std::chrono::steady_clock;
double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::optional<double> device_memory_in_use(const Backend& backend) {
#ifdef POPE_HAVE_CUDA
  if (backend.device() == DeviceKind::cuda) return double(cuda_memory_in_use());
#endif
  (void)backend;
  return std::nullopt;
}

struct StepTimes {
  double forward_backward = 0.0;  // zero gradients + every micro-batch
  double optimizer = 0.0;         // gradient norm, clipping, AdamW
  double loss = 0.0;              // mean over the step's tokens
};

// The Trainer's step without data loading, logging or checkpoints.
class StepRunner {
 public:
  StepRunner(const RunConfig& config, Backend& backend, Model& model, AdamW& optimizer,
             const std::vector<TokenBatch>& batches)
      : config_(config), backend_(backend), model_(model), optimizer_(optimizer), batches_(batches) {}

  long tokens_per_step() const {
    return long(batches_.size()) * config_.train.micro_batch_size * config_.train.seq_len;
  }

  StepTimes step(long step_number) {
    const int B = config_.train.micro_batch_size, T = config_.train.seq_len;
    const double grad_scale = 1.0 / double(tokens_per_step());
    StepTimes times;
    backend_.synchronize();
    const auto start = Clock::now();
    model_.zero_gradients();
    double loss_sum = 0.0;
    for (const TokenBatch& batch : batches_)
      loss_sum += model_.forward_backward(batch.inputs.data(), batch.targets.data(), B, T, grad_scale).sum;
    backend_.synchronize();
    const auto middle = Clock::now();
    const double lr = learning_rate(config_.optim, step_number - 1, config_.train.steps);
    const OptimizerStepResult result = optimizer_.step(step_number, lr);
    backend_.synchronize();
    const auto end = Clock::now();
    times.forward_backward = seconds_between(start, middle);
    times.optimizer = seconds_between(middle, end);
    times.loss = loss_sum / double(tokens_per_step());
    if (!std::isfinite(times.loss) || !result.applied)
      throw std::runtime_error(
          fmt::format("benchmark step {}: non-finite loss {} or gradient norm {}; the numbers "
                      "would be meaningless (check the config's optim.lr and the backend)",
                      step_number, times.loss, result.grad_norm));
    return times;
  }

  // Model::forward (with the loss, no backward) over the same micro-batches.
  double forward_only() {
    const int B = config_.train.micro_batch_size, T = config_.train.seq_len;
    backend_.synchronize();
    const auto start = Clock::now();
    for (const TokenBatch& batch : batches_) model_.forward(batch.inputs.data(), batch.targets.data(), B, T);
    backend_.synchronize();
    return seconds_between(start, Clock::now());
  }

 private:
  const RunConfig& config_;
  Backend& backend_;
  Model& model_;
  AdamW& optimizer_;
  const std::vector<TokenBatch>& batches_;
};

// Forward-only passes are an extra cost of the benchmark, so only a few are timed.
constexpr int kForwardRepeats = 3;

}  // namespace

TrainBenchResult run_train_benchmark(const RunConfig& config, const TrainBenchOptions& options) {
  validate(config);
  if (options.timed_steps < 1)
    throw ConfigError("--steps", fmt::format("expected at least 1 timed step, got {}", options.timed_steps));
  if (options.warmup_steps < 0)
    throw ConfigError("--warmup", fmt::format("expected 0 or more warmup steps, got {}", options.warmup_steps));

  const int accumulation = config.grad_accumulation(1);
  const std::vector<TokenBatch> batches = make_token_batches(config, accumulation, options.use_data, options.seed);

  std::unique_ptr<Backend> device = make_backend(config.train.device, "float", config.train.threads);
  const std::optional<double> memory_before = device_memory_in_use(*device);
  // Only a profiled run goes through the decorator; while disabled it just forwards.
  std::unique_ptr<ProfilingBackend> profiler = options.profile ? std::make_unique<ProfilingBackend>(*device) : nullptr;
  Backend& backend = profiler ? static_cast<Backend&>(*profiler) : *device;

  Model model(config.model, backend);
  apply_model_options(model, config);
  model.initialize(config.train.seed);
  AdamW optimizer(model, config.optim);
  StepRunner runner(config, backend, model, optimizer, batches);

  TrainBenchResult r;
  r.backend = backend.description();
  r.on_gpu = backend.device() == DeviceKind::cuda;
  r.position_kind = config.model.position.kind;
  r.parameters = model.parameter_count();
  r.micro_batch = config.train.micro_batch_size;
  r.seq_len = config.train.seq_len;
  r.accumulation = accumulation;
  r.random_tokens = !options.use_data;
  r.tokens_per_step = runner.tokens_per_step();

  long step_number = 0;
  for (int i = 0; i < options.warmup_steps; ++i) runner.step(++step_number);
  std::optional<double> memory_peak = device_memory_in_use(backend);

  std::vector<double> forward_backward, optimizer_times;
  for (int i = 0; i < options.timed_steps; ++i) {
    const StepTimes t = runner.step(++step_number);
    r.step_seconds.push_back(t.forward_backward + t.optimizer);
    forward_backward.push_back(t.forward_backward);
    optimizer_times.push_back(t.optimizer);
    r.last_loss = t.loss;
    if (const auto used = device_memory_in_use(backend)) memory_peak = std::max(memory_peak.value_or(0.0), *used);
  }
  std::vector<double> forward;
  for (int i = 0; i < std::min(options.timed_steps, kForwardRepeats); ++i) forward.push_back(runner.forward_only());

  r.median_step_seconds = median(r.step_seconds);
  r.tokens_per_second = double(r.tokens_per_step) / r.median_step_seconds;
  r.flops_per_token = model_flops_per_token(r.parameters, config.model, config.train.seq_len);
  const double flops_per_second = r.flops_per_token * r.tokens_per_second;
  r.model_tflops = flops_per_second / 1e12;
  if (r.on_gpu) r.mfu = flops_per_second / kH200PeakBf16Flops;
  r.forward_seconds = median(forward);
  r.backward_seconds = std::max(0.0, median(forward_backward) - r.forward_seconds);
  r.optimizer_seconds = median(optimizer_times);
  if (memory_peak && memory_before) {
    r.device_memory_bytes = memory_peak;
    r.device_memory_added_bytes = *memory_peak - *memory_before;
  }

  if (profiler) {
    profiler->set_enabled(true);
    const StepTimes t = runner.step(++step_number);
    profiler->set_enabled(false);
    r.profile = profiler->times();
    r.profiled_step_seconds = t.forward_backward + t.optimizer;
  }
  return r;
}

}  // namespace pope
