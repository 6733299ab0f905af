// Validation of a RunConfig (per-key ranges from the schema, then the rules that relate
// keys), the gradient-accumulation split and the config hash.
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "config/config_schema.hpp"
#include "pope/config.hpp"
#include "pope/indirect_indexing.hpp"
#include "pope/model.hpp"
#include "pope/position.hpp"
#include "position/registry.hpp"

namespace pope {

using config_schema::fail;

ConfigError::ConfigError(std::string path, const std::string& message)
    : std::runtime_error(path + ": " + message), path_(std::move(path)), message_(message) {}

namespace {

// Why `batch_size` cannot be split into micro-batches over `world_size` ranks, if it cannot.
std::optional<std::string> batch_split_problem(const TrainConfig& train, int world_size) {
  if (world_size < 1) return fmt::format("the world size must be at least 1, found {}", world_size);
  const long per_step = long(train.micro_batch_size) * world_size;
  if (train.micro_batch_size < 1 || train.batch_size % per_step != 0) {
    return fmt::format("expected a multiple of train.micro_batch_size ({}) × world size ({}) = {}, found {}",
                       train.micro_batch_size, world_size, per_step, train.batch_size);
  }
  return std::nullopt;
}

std::string range_text(const config_schema::Range& range) {
  const char* low = range.min_exclusive ? ">" : ">=";
  const char* high = range.max_exclusive ? "<" : "<=";
  if (range.min && range.max) {
    return fmt::format("in {}{}, {}{}", range.min_exclusive ? "(" : "[", *range.min, *range.max,
                       range.max_exclusive ? ")" : "]");
  }
  if (range.min) return fmt::format("{} {}", low, *range.min);
  if (range.max) return fmt::format("{} {}", high, *range.max);
  return "";
}

bool in_range(double value, const config_schema::Range& range) {
  if (range.min && (range.min_exclusive ? value <= *range.min : value < *range.min)) return false;
  if (range.max && (range.max_exclusive ? value >= *range.max : value > *range.max)) return false;
  return true;
}

void check_field(const config_schema::Field& field, const RunConfig& config, const std::string& source) {
  const std::string path(field.path);
  std::visit(
      [&](auto access) {
        const auto& value = config_schema::read(access, config);
        using T = std::decay_t<decltype(value)>;
        if constexpr (std::is_same_v<T, std::string>) {
          if (field.allowed.empty()) return;
          for (std::string_view allowed : field.allowed) {
            if (value == allowed) return;
          }
          fail(path, fmt::format("expected one of {}; found \"{}\"", fmt::join(field.allowed, ", "), value), source);
        } else if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
          if (in_range(double(value), field.range)) return;
          fail(path,
               fmt::format("expected {} {}, found {}", std::is_integral_v<T> ? "an integer" : "a number",
                           range_text(field.range), value),
               source);
        }
      },
      field.access);
}

void check_model_shape(const ModelConfig& model, const std::string& source) {
  if (model.n_embd % model.n_head != 0) {
    fail("model.n_embd",
         fmt::format("expected a multiple of model.n_head ({}), found {}", model.n_head, model.n_embd), source);
  }
  // RoPE and PoPE both pair channels of a head; every paper model has an even head dim.
  if (model.head_dim() % 2 != 0) {
    fail("model.n_embd",
         fmt::format("expected an even head dim n_embd / n_head, found {} / {} = {}", model.n_embd, model.n_head,
                     model.head_dim()),
         source);
  }
  if (model.padded_vocab_size < model.vocab_size) {
    fail("model.padded_vocab_size",
         fmt::format("expected at least model.vocab_size ({}), found {}", model.vocab_size,
                     model.padded_vocab_size),
         source);
  }
}

void check_position(const ModelConfig& model, const std::string& source) {
  const PositionConfig& position = model.position;
  const RopeScalingConfig& scaling = position.rope.scaling;
  if (scaling.yarn_beta <= scaling.yarn_alpha) {
    fail("model.position.rope.scaling.yarn_beta",
         fmt::format("expected more than yarn_alpha ({}), found {}", scaling.yarn_alpha, scaling.yarn_beta),
         source);
  }
  if (find_position_method(position.kind) == nullptr) return;  // the key's own check names the allowed kinds
  // Each encoding's factory checks the keys it reads, naming them.
  try {
    (void)make_position_encoding(model);
  } catch (const ConfigError& e) {
    fail(e.path(), e.message(), source);
  }
}

// Limits on products of sizes that are each within their key's range. 2^40 parameters (1,400×
// the paper's 774M) would need 8 TiB for the fp32 weights and gradients every rank holds; the
// tokens of a step and of a micro-batch are counted in 32-bit ints (the dry run's batch plan, the
// row counts of the CUDA embedding, RMSNorm and cross-entropy kernels).
constexpr double kMaxParameters = 1099511627776.0;  // 2^40
constexpr long kMaxTokensPerStep = std::numeric_limits<int>::max();

void check_sizes(const RunConfig& config, const std::string& source) {
  const ModelConfig& model = config.model;
  const double parameters = config_schema::parameter_count(model);
  // model.n_embd is in both the layers' (12·n_embd² each) and the embedding's (vocab × n_embd) terms.
  if (parameters > kMaxParameters) {
    fail("model.n_embd",
         fmt::format("expected at most 2^40 = {:.0f} parameters, found {:.0f} from model.n_layer ({}), model.n_embd "
                     "({}), model.vocab_size ({}) and model.position.kind ({})",
                     kMaxParameters, parameters, model.n_layer, model.n_embd, model.vocab_size, model.position.kind),
         source);
  }
  const long tokens = long(config.train.batch_size) * config.train.seq_len;
  if (tokens > kMaxTokensPerStep) {
    fail("train.seq_len",
         fmt::format("expected train.batch_size ({}) × train.seq_len ({}) to be at most 2^31 − 1 = {} tokens per "
                     "step, found {}",
                     config.train.batch_size, config.train.seq_len, kMaxTokensPerStep, tokens),
         source);
  }
}

// FP8 runs on FP8 tensor cores only; the CPU backend's FP8 ops are the GPU's test reference.
void check_precision(const RunConfig& config, const std::string& source) {
  if (config.train.precision == Precision::fp8 && config.train.device == DeviceChoice::cpu)
    fail("train.precision",
         "expected bf16 with train.device cpu: fp8 runs on the CUDA backend, on GPUs with FP8 tensor cores (sm_89 "
         "or later)",
         source);
}

// cuDNN's SDPA (attention.impl = cudnn) takes q̃, k̃, v and a scale, nothing else: encodings that
// add a score bias (ALiBi, the PJ-bias methods) have no place in it, and there is no CPU cuDNN.
// Its widths: head dims that are multiples of 8 with q/k rows of at most 256 (PoPE: d ≤ 128).
void check_attention_impl(const RunConfig& config, const std::string& source) {
  if (config.attention.impl != AttentionImpl::cudnn) return;
  const std::unique_ptr<PositionEncoding> encoding = make_position_encoding(config.model);
  if (encoding->has_score_bias()) {
    fail("attention.impl",
         fmt::format("expected fused for model.position.kind {}: its score bias is not supported by cuDNN's SDPA "
                     "(cudnn takes encodings without a bias: nope, rope and its scalings, pope, pj_rotary)",
                     config.model.position.kind),
         source);
  }
  if (config.train.device == DeviceChoice::cpu) {
    fail("attention.impl", "expected fused with train.device cpu: cudnn runs on the CUDA backend only", source);
  }
  const int head_dim = config.model.head_dim();
  const int qk_width = encoding->qk_width(head_dim);
  if (head_dim % 8 != 0 || qk_width > 256) {
    fail("attention.impl",
         fmt::format("expected fused for head dim {} (q/k width {}): cudnn needs a head dim that is a multiple of 8 "
                     "and q/k rows of at most 256",
                     head_dim, qk_width),
         source);
  }
}

// Training windows longer than L_train only make sense for encodings that do not depend on
// it: NoPE, ALiBi, PoPE and the PJ methods extrapolate as they are, RoPE (alone or under a
// bias) only with a scaling (PI/NTK/YaRN fine-tuning at 4096 on a 1024 model).
void check_window(const RunConfig& config, const std::string& source) {
  const PositionConfig& position = config.model.position;
  if (config.train.seq_len > config.model.context_length && !make_position_encoding(config.model)->extrapolates()) {
    fail("train.seq_len",
         fmt::format("expected at most model.context_length ({}) for kind {} (rope without a scaling), found {}",
                     config.model.context_length, position.kind, config.train.seq_len),
         source);
  }
}

// The indirect-indexing task generates its data: no token files, its own vocabulary, and
// rows long enough for the longest prompt.
void check_indirect_indexing(const RunConfig& config, const std::string& source) {
  indirect_indexing::check_config(config.data.indirect_indexing, source);
  for (const auto& [key, value] : {std::pair{"data.train", &config.data.train}, {"data.val", &config.data.val}}) {
    if (!value->empty())
      fail(key, fmt::format("expected \"\" with data.kind indirect_indexing (the task generates its data), found "
                            "\"{}\"",
                            *value),
           source);
  }
  if (config.model.vocab_size != indirect_indexing::kVocabSize) {
    fail("model.vocab_size",
         fmt::format("expected {} (the indirect-indexing vocabulary) with data.kind indirect_indexing, found {}",
                     indirect_indexing::kVocabSize, config.model.vocab_size),
         source);
  }
  const int longest = indirect_indexing::max_prompt_length(config.data.indirect_indexing);
  if (config.train.seq_len < longest) {
    fail("train.seq_len",
         fmt::format("expected at least {} (the longest indirect-indexing prompt: max_len {} + 8 separator, "
                     "character and sign tokens + the shift's digits), found {}",
                     longest, config.data.indirect_indexing.max_len, config.train.seq_len),
         source);
  }
}

// Hex of the 64-bit FNV-1a hash of `bytes`.
std::string fnv1a_64_hex(const std::string& bytes) {
  std::uint64_t hash = 14695981039346656037ull;
  for (unsigned char byte : bytes) {
    hash ^= byte;
    hash *= 1099511628211ull;
  }
  return fmt::format("{:016x}", hash);
}

}  // namespace

namespace config_schema {

// Every layer has the same parameters, so count_parameters is P(1) + (n_layer − 1)·(P(2) − P(1)):
// two layouts of one and two layers instead of n_layer, each count exact in int64 within the
// per-key bounds, and the sum in double, so that no size can make it wrap.
double parameter_count(const ModelConfig& model) {
  const std::unique_ptr<PositionEncoding> position = make_position_encoding(model);
  ModelConfig shallow = model;
  shallow.n_layer = 1;
  const double one_layer = double(count_parameters(shallow, build_parameter_layout(shallow, *position)));
  shallow.n_layer = 2;
  const double per_layer = double(count_parameters(shallow, build_parameter_layout(shallow, *position))) - one_layer;
  return one_layer + double(model.n_layer - 1) * per_layer;
}

void check_config(const RunConfig& config, const std::string& source) {
  // Per-key ranges first: the rules below divide by n_head and micro_batch_size.
  for (const Field& field : fields()) check_field(field, config, source);
  check_model_shape(config.model, source);
  check_position(config.model, source);
  // After the shape and position rules: counting builds the position encoding, which checks them too.
  check_sizes(config, source);
  check_window(config, source);
  check_attention_impl(config, source);
  check_precision(config, source);
  if (config.data.kind == DataKind::indirect_indexing) check_indirect_indexing(config, source);
  if (config.train.sample_every > 0 && config.data.kind != DataKind::tokens)
    fail("train.sample_every", "expected 0 with data.kind indirect_indexing: samples are GPT-2 text", source);
  if (config.train.sample_every > 0 && config.train.sample_prompt.empty())
    fail("train.sample_prompt", "expected some text to start the samples from, found an empty prompt", source);
  if (auto problem = batch_split_problem(config.train, 1)) fail("train.batch_size", *problem, source);
  // Decoupled decay multiplies every matrix by 1 − lr·wd each step: at 1 or more it zeroes or flips them.
  if (config.optim.lr * config.optim.weight_decay >= 1) {
    fail("optim.weight_decay",
         fmt::format("expected optim.lr ({}) × optim.weight_decay below 1 (the decay factor 1 − lr·wd of every "
                     "step), found {}",
                     config.optim.lr, config.optim.weight_decay),
         source);
  }
  if (config.optim.min_lr > config.optim.lr) {
    fail("optim.min_lr",
         fmt::format("expected at most optim.lr ({}), found {}", config.optim.lr, config.optim.min_lr), source);
  }
}

}  // namespace config_schema

void validate(const RunConfig& config) { config_schema::check_config(config, ""); }

int RunConfig::grad_accumulation(int world_size) const {
  if (auto problem = batch_split_problem(train, world_size)) throw ConfigError("train.batch_size", *problem);
  return train.batch_size / (train.micro_batch_size * world_size);
}

std::string config_hash(const RunConfig& config) {
  nlohmann::json resolved = config_to_json(config);
  const nlohmann::json defaults = config_to_json(RunConfig{});
  using config_schema::Hashed;
  for (const config_schema::Field& field : config_schema::fields()) {
    const auto pointer = config_schema::pointer_to(field.path);
    const bool at_default = resolved.at(pointer) == defaults.at(pointer);
    if (field.hashed == Hashed::no || (field.hashed == Hashed::unless_default && at_default))
      resolved[pointer.parent_pointer()].erase(pointer.back());
  }
  // nlohmann::json objects are key-sorted and numbers print in shortest round-trip form,
  // so the compact dump is a canonical text of the config.
  return fnv1a_64_hex(resolved.dump());
}

std::vector<ConfigChange> config_hash_changes(const RunConfig& before, const RunConfig& after) {
  const nlohmann::json old_values = config_to_json(before), new_values = config_to_json(after);
  std::vector<ConfigChange> changes;
  for (const config_schema::Field& field : config_schema::fields()) {
    if (field.hashed == config_schema::Hashed::no) continue;
    const auto pointer = config_schema::pointer_to(field.path);
    const nlohmann::json& was = old_values.at(pointer);
    const nlohmann::json& now = new_values.at(pointer);
    if (was != now) changes.push_back({std::string(field.path), was.dump(), now.dump()});
  }
  return changes;
}

std::vector<std::string> config_hash_differences(const RunConfig& before, const RunConfig& after) {
  std::vector<std::string> differences;
  for (const ConfigChange& change : config_hash_changes(before, after))
    differences.push_back(fmt::format("{}: {} → {}", change.key, change.before, change.after));
  return differences;
}

}  // namespace pope
