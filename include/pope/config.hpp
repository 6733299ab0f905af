// The run configuration: typed structs with documented defaults (configs/README.md lists
// every key), loaded from JSON, overridden with `--set a.b.c=value`, validated, and
// written back (resolved) into the run directory.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "pope/config_values.hpp"
#include "pope/named_enum.hpp"

namespace pope {

// Every config problem: the JSON path (e.g. "model.n_head"), the file, and what was
// expected. Tools map it to exit code 2.
class ConfigError : public std::runtime_error {
 public:
  ConfigError(std::string path, const std::string& message);
  const std::string& path() const { return path_; }
  const std::string& message() const { return message_; }  // without the path

 private:
  std::string path_;
  std::string message_;
};

// The spellings of the named config values (pope/config_values.hpp), in enum order.
template <> struct EnumNames<RopeScalingKind> {
  static constexpr std::array<std::string_view, 5> names{"none", "pi", "ntk", "dynamic_ntk", "yarn"};
};
template <> struct EnumNames<MagnitudeKind> {
  static constexpr std::array<std::string_view, 3> names{"softplus", "identity", "relu"};
};
template <> struct EnumNames<DeltaInit> {
  static constexpr std::array<std::string_view, 2> names{"zero", "uniform"};
};
template <> struct EnumNames<DeltaBound> {
  static constexpr std::array<std::string_view, 3> names{"clamp", "none", "project"};
};
template <> struct EnumNames<PopeScale> {
  static constexpr std::array<std::string_view, 2> names{"inv_sqrt_d", "inv_sqrt_2d"};
};
template <> struct EnumNames<PjRho> {
  static constexpr std::array<std::string_view, 2> names{"linear", "lightcone"};
};
template <> struct EnumNames<PjGateInit> {
  static constexpr std::array<std::string_view, 4> names{"affine", "uniform", "alibi", "zero"};
};
template <> struct EnumNames<DataKind> {
  static constexpr std::array<std::string_view, 2> names{"tokens", "indirect_indexing"};
};
template <> struct EnumNames<LrSchedule> {
  static constexpr std::array<std::string_view, 3> names{"cosine", "linear", "constant"};
};
template <> struct EnumNames<DeviceChoice> {
  static constexpr std::array<std::string_view, 3> names{"auto", "cpu", "cuda"};
};
template <> struct EnumNames<AttentionImpl> {
  static constexpr std::array<std::string_view, 2> names{"fused", "cudnn"};
};
template <> struct EnumNames<Precision> {
  static constexpr std::array<std::string_view, 2> names{"bf16", "fp8"};
};

struct RopeScalingConfig {
  RopeScalingKind kind = RopeScalingKind::none;
  double factor = 1.0;             // s; for dynamic_ntk computed per length, this is ignored
  double yarn_alpha = 1.0;         // YaRN ramp start (in rotations over the training length)
  double yarn_beta = 32.0;         // YaRN ramp end
  double yarn_temperature = 0.0;   // 0: the default 0.1·ln(s) + 1; otherwise this q/k multiplier
};

struct RopeConfig {
  double base = 10000.0;
  double fraction = 1.0;           // share of each head's channels that rotate (Table 9: 0.5)
  RopeScalingConfig scaling;
};

struct PopeConfig {
  double base = 10000.0;
  MagnitudeKind magnitude = MagnitudeKind::softplus;
  bool learn_delta = true;              // false: the "no δ" ablation (δ ≡ 0, no parameter)
  DeltaInit delta_init = DeltaInit::zero;  // uniform: U(−2π, 0)
  DeltaBound delta_bound = DeltaBound::clamp;  // none: δ unbounded; project: clamped after each update
  PopeScale scale = PopeScale::inv_sqrt_d;
};

// xPos (position/xpos.cpp): RoPE with a per-pair decay ζ_m^((t−s)/scale_base).
struct XposConfig {
  double base = 10000.0;           // rotation frequencies base^(−2m/d)
  double scale_base = 512.0;       // γ of the decay
};

// T5's relative-position bias (position/t5_bias.cpp): a learned scalar per head and lag bucket.
struct T5BiasConfig {
  int buckets = 32;                // B: B/2 exact lags, then B/2 log-spaced buckets
  int max_distance = 128;          // lags from here on share the last bucket
};

struct AlibiConfig {
  double head_fraction = 1.0;      // share of heads with a slope (Table 9: 0.5); the rest NoPE
};

// PJ-RoPE (docs/encodings.md, section 5): the PJ-bias options and the PJ-rotary
// transform options. Which bias sectors are on follows from model.position.kind.
struct PjConfig {
  int order = 3;                      // jet order K of the PJ-bias (orders 0..K)
  PjRho rho = PjRho::linear;        // the affine sector's ρ(Δ)
  PjGateInit gate_init = PjGateInit::affine;
  int rotary_order = 1;               // jet order K of PJ-rotary (0 = RoPE, adjacent pairs)
  double rotary_eta = 1.0;            // shear rate η: c_p = η·p/L_train
  double rotary_base = 10000.0;       // block frequencies base^(−m/M)
};

struct PositionConfig {
  // A method of the registry (position/registry.hpp; configs/README.md lists them).
  std::string kind = "pope";
  RopeConfig rope;
  PopeConfig pope;
  AlibiConfig alibi;
  PjConfig pj;
  XposConfig xpos;
  T5BiasConfig t5_bias;
};

struct ModelConfig {
  int vocab_size = 50257;          // real vocabulary: logits past it are excluded from the loss
  int padded_vocab_size = 50304;   // embedding rows (a multiple of 64 for fast GEMMs)
  int n_layer = 12;
  int n_head = 12;
  int n_embd = 768;
  int context_length = 1024;       // L_train: the length the model is trained at
  double norm_eps = 1e-5;
  double init_std = 0.02;
  PositionConfig position;

  int head_dim() const { return n_embd / n_head; }
};

// The synthetic indirect-indexing task (the PoPE paper's setup): examples are a pure function of
// (seed, split, index), so no split is ever stored.
struct IndirectIndexingConfig {
  std::uint64_t seed = 0;          // the data set itself; train.seed only orders the training draws
  long train_size = 1000000;
  int val_size = 10000;
  int test_size = 10000;
  int min_len = 20;                // source string length range, distinct letters of the 52
  int max_len = 40;
  int max_shift = 15;              // shifts in [−max_shift, max_shift]
  bool zero_shift = false;         // whether shift 0 (target = source character) is allowed
};

struct DataConfig {
  DataKind kind = DataKind::tokens;
  std::string train = "";          // token file (llm.c shard or nanoGPT .bin), directory or glob
  std::string val = "";            // empty: no validation
  IndirectIndexingConfig indirect_indexing;
};

struct OptimConfig {
  double lr = 6e-4;
  double min_lr = 6e-5;
  int warmup_steps = 1000;
  LrSchedule schedule = LrSchedule::cosine;  // after warmup
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.01;       // decoupled; 2-D weight matrices only
  double grad_clip = 1.0;           // global norm; 0 disables
};

// CPU threads at most (train.threads and the tools' --threads): more than any machine's cores
// only oversubscribe it, and libgomp allocates per-thread state up front, so 100,000 threads
// crash it and 2^31 − 1 run it out of memory.
inline constexpr int kMaxThreads = 1024;

struct TrainConfig {
  long steps = 100000;
  int batch_size = 64;             // global batch in sequences = micro × accumulation × ranks
  int micro_batch_size = 16;       // sequences per forward/backward
  int seq_len = 1024;              // training window length (≤ model.context_length unless scaled)
  std::uint64_t seed = 1337;
  int log_every = 10;
  int eval_every = 500;            // 0: never (a final evaluation still runs when val is set)
  int eval_batches = 20;           // micro-batches of validation windows, spread over the file
  int checkpoint_every = 1000;     // 0: only at the end
  int keep_checkpoints = 3;
  int max_nonfinite_steps = 5;     // consecutive skipped updates before aborting
  bool activation_recompute = false;  // recompute RMSNorm and GELU outputs in the backward
  Precision precision = Precision::bf16;  // fp8: the blocks' linear layers in FP8 (CUDA, sm_89+)
  int fp8_amax_history = 16;       // fp8: steps of amax behind each tensor's scale (delayed scaling)
  bool deterministic = true;       // false: the fused attention backward adds dq with atomics (faster)
  double ddp_bucket_mb = 25.0;     // data parallel: gradient all-reduce buckets (MiB) overlapped with
                                   // the backward; 0: one all-reduce after it
  int zero_stage = 0;              // data parallel: 1 shards the optimizer state over the ranks (ZeRO-1)
  bool phase_timing = false;       // log each window's mean device time per step phase (eager steps)
  DeviceChoice device = DeviceChoice::automatic;
  int threads = 0;                 // CPU threads; 0: all cores; at most kMaxThreads
  int sample_every = 0;            // steps between samples printed to the log; 0: never
  std::string sample_prompt = "\n";  // the samples' prompt (GPT-2 text)
  int sample_tokens = 64;          // new tokens per sample
};

struct AttentionConfig {
  // fused | cudnn: who computes the causal attention of the encoded q̃, k̃ on the GPU; cudnn is
  // cuDNN's fused SDPA, a comparator for encodings without a score bias (configs/README.md).
  AttentionImpl impl = AttentionImpl::fused;
};

struct RunConfig {
  ModelConfig model;
  DataConfig data;
  OptimConfig optim;
  TrainConfig train;
  AttentionConfig attention;
  std::string out_dir = "";        // run directory; empty: runs/<config name>

  // Micro-batches per optimizer step on `world_size` ranks (validated to divide exactly).
  int grad_accumulation(int world_size = 1) const;
};

// Loads `path`; a bare name without '/' that does not exist is looked up in `configs/`
// (next to the working directory, then the source tree). Overrides are "a.b.c=value"
// strings applied before validation. Throws ConfigError.
RunConfig load_config(const std::filesystem::path& path, const std::vector<std::string>& overrides = {});
std::filesystem::path resolve_config_path(const std::filesystem::path& path);

// From / to JSON (the complete, resolved form with every key). Throws ConfigError.
RunConfig config_from_json(const nlohmann::json& json, const std::string& source = "<json>");
nlohmann::json config_to_json(const RunConfig& config);
void apply_override(nlohmann::json& json, const std::string& assignment);
void validate(const RunConfig& config);  // ranges and cross-field rules; throws ConfigError

// Stable hash of the resolved config (hex), stored in checkpoints to detect mismatched resumes:
// without the unhashed keys, and without the keys hashed unless_default that hold their default.
std::string config_hash(const RunConfig& config);
// A hashed key whose value differs between two configs, the values as JSON text.
struct ConfigChange {
  std::string key, before, after;
};
// The hashed keys whose values differ, in README order: what makes two configs' hashes
// differ, for the message of a refused resume.
std::vector<ConfigChange> config_hash_changes(const RunConfig& before, const RunConfig& after);
// The same as "key: before → after".
std::vector<std::string> config_hash_differences(const RunConfig& before, const RunConfig& after);

}  // namespace pope
