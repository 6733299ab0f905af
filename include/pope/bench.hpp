// pope-bench train: the throughput of whole optimizer steps (micro-batches × accumulation +
// clipping + AdamW) of the model a config describes, where a step's time goes, and a dump of
// one forward/backward for the independent PyTorch oracle (scripts/reference/torch_gpt.py).
// No Trainer and no checkpoints: Model and AdamW are built directly from the config.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "pope/config.hpp"

namespace pope {

// The bf16 dense-matmul ceiling of one H200 (docs/benchmarks.md) that MFU is reported against.
constexpr double kH200PeakBf16Flops = 790e12;

// Model FLOPs per trained token, nanoGPT/PaLM convention: 6·N for the weight matmuls of the
// forward and backward pass (N = all trainable parameters, the tied embedding counted once)
// plus 12·n_layer·seq_len·n_embd for attention scores and values (causal counted in full).
double model_flops_per_token(std::int64_t parameters, const ModelConfig& model, int seq_len);

struct TrainBenchOptions {
  int warmup_steps = 3;
  int timed_steps = 10;
  bool use_data = false;  // windows of data.train instead of random tokens
  bool profile = false;   // one extra step with a per-op time breakdown (ProfilingBackend)
  std::uint64_t seed = 1337;
};

// pope-bench sample: generation with the key/value cache from the config's model (initialised,
// not trained: the speed does not depend on the weights) on random prompt tokens, greedy.
struct SampleBenchOptions {
  int batch = 1;            // sequences decoded together
  int prompt_tokens = 128;  // prefill length
  int new_tokens = 256;     // decode steps
  int rounds = 3;           // timed generations after one untimed (median reported)
  std::uint64_t seed = 1337;
};

struct SampleBenchResult {
  std::string backend, position_kind;
  std::int64_t parameters = 0;
  SampleBenchOptions options;
  double prefill_tokens_per_second = 0.0;  // batch × prompt_tokens over the median prefill time
  double decode_tokens_per_second = 0.0;   // batch × new_tokens over the median decode time
  double decode_ms_per_step = 0.0;         // median decode time / new_tokens
};

SampleBenchResult run_sample_benchmark(const RunConfig& config, const SampleBenchOptions& options);
std::string format_sample_bench(const SampleBenchResult& result);
nlohmann::json sample_bench_to_json(const SampleBenchResult& result);

// Time of one op family (and, for products and FP8 casts, one shape) summed over the profiled step.
struct OpTime {
  std::string op;      // backend op name, e.g. "matmul", "attention_backward"
  std::string detail;  // "" or the shape, e.g. "out [1024, 2304] = a [1024, 768] · bᵀ [2304, 768]"
  long calls = 0;
  double seconds = 0.0;
  double flops = 0.0;  // products only (2·M·N·K per call); 0 elsewhere
  double bytes = 0.0;  // FP8 casts only: the bytes each call must read and write; 0 elsewhere
};

struct TrainBenchResult {
  std::string backend;  // the backend's description
  bool on_gpu = false;
  std::string position_kind;
  std::int64_t parameters = 0;  // count_parameters: tied embedding once, padded rows excluded
  int micro_batch = 0, seq_len = 0, accumulation = 0;
  bool random_tokens = true;
  long tokens_per_step = 0;
  std::vector<double> step_seconds;  // every timed step
  double median_step_seconds = 0.0;
  double tokens_per_second = 0.0;  // tokens_per_step / median_step_seconds
  double flops_per_token = 0.0;
  double model_tflops = 0.0;
  std::optional<double> mfu;  // GPU only: model FLOP/s over kH200PeakBf16Flops
  // Medians per step: forward (Model::forward over the same micro-batches, timed separately),
  // backward (forward+backward minus forward), optimizer (gradient norm, clipping, AdamW).
  double forward_seconds = 0.0, backward_seconds = 0.0, optimizer_seconds = 0.0;
  // GPU only: the most device memory in use (total − free, CUDA context included) seen after
  // warmup and after every timed step, and how much of it the run added.
  std::optional<double> device_memory_bytes, device_memory_added_bytes;
  double last_loss = 0.0;
  // --profile: per-op times of one step with a synchronize around every op.
  std::vector<OpTime> profile;
  double profiled_step_seconds = 0.0;
};

// Builds backend (config.train.device), Model and AdamW, warms up, times the steps. Throws
// ConfigError (bad options), DataError (--data with a bad file) or std::runtime_error (a
// non-finite loss, backend failures).
TrainBenchResult run_train_benchmark(const RunConfig& config, const TrainBenchOptions& options);

// A short human-readable table (and the profile, when there is one), and the same numbers as JSON.
std::string format_train_bench(const TrainBenchResult& result);
nlohmann::json train_bench_to_json(const TrainBenchResult& result);

// One forward/backward of the config's micro-batch (micro_batch_size × seq_len random tokens,
// a few targets masked) written as safetensors: every parameter (F32, model names), "tokens" and
// "targets" (I32 [B, T]), "loss" (F32 scalar: mean cross-entropy over unmasked targets) and
// "grad.<name>" (F32, the gradient of that mean). Norm gains and positional parameters are
// jittered away from their initial values first, so that a misapplied gain or offset shows.
// Metadata: "format" = "pope-step-dump", "config" (resolved config JSON), "backend",
// "activation_dtype". Throws CheckpointError when the file cannot be written.
void write_step_dump(const RunConfig& config, const std::filesystem::path& path, std::uint64_t seed = 1337);

}  // namespace pope
