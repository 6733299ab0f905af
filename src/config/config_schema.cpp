// The table of config keys. Defaults are not repeated here: they are the member
// initialisers in pope/config.hpp, and a key missing from a JSON file keeps them.
#include "config/config_schema.hpp"

#include <algorithm>

#include "position/registry.hpp"

#include <fmt/format.h>

namespace pope::config_schema {

namespace {

// Upper bounds of the size keys: far above every paper setting (774M: 36 layers, n_embd 1280,
// 20 heads, vocabulary 50,257 padded to 50,304; windows up to 10,240 in evaluation, fine-tunes
// at 4,096), yet small enough that a dry run, which lays out every layer, finishes at once, and
// that the products of two sizes (embedding rows × n_embd, n_embd², micro-batch × window) cannot
// overflow 64-bit element counts. Unbounded, 2^31 − 1 layers hang the dry run and a width of
// 2^30 makes the parameter count wrap. check_config adds the cross-key limits (parameter
// count, tokens per step).
constexpr double kMaxLayers = 1024;
constexpr double kMaxWidth = 65536;        // n_embd, and so n_head (it divides n_embd)
constexpr double kMaxVocab = 1 << 24;      // vocab_size, padded_vocab_size
constexpr double kMaxLength = 1 << 20;     // context_length, seq_len
constexpr double kMaxSequences = 1 << 20;  // batch_size, micro_batch_size
// A bucket larger than any gradient arena is one bucket already; the bound keeps the byte
// count (MiB × 2^20, converted to int64) from overflowing.
constexpr double kMaxBucketMib = 1 << 20;
// Bounds of the optimizer and initialisation numbers: what can train at all, far outside every
// setting in use (lr 1e-5 … 1e-2, init_std 0.02, ε 1e-8). optim.lr = 1e300 wrote a checkpoint of
// infinite weights; a std or a YaRN multiplier past these overflows the first logits.
constexpr double kMaxLearningRate = 10;
constexpr double kMaxInitStd = 1;
constexpr double kMaxEpsilon = 1;             // norm_eps, optim.eps: above it ε swamps what it guards
constexpr double kMaxWeightDecay = 10;        // and lr × weight_decay < 1 (check_config)
constexpr double kMaxYarnTemperature = 10;

// Every name model.position.kind accepts, aliases included.
std::vector<std::string_view> position_kind_values() {
  std::vector<std::string_view> kinds;
  for (const PositionMethod& method : position_methods()) kinds.push_back(method.name);
  return kinds;
}

std::vector<Field> make_fields() {
  return {
      {POPE_CONFIG_KEY(model.vocab_size), between(1, kMaxVocab)},
      {POPE_CONFIG_KEY(model.padded_vocab_size), between(1, kMaxVocab)},
      {POPE_CONFIG_KEY(model.n_layer), between(1, kMaxLayers)},
      {POPE_CONFIG_KEY(model.n_head), between(1, kMaxWidth)},
      {POPE_CONFIG_KEY(model.n_embd), between(1, kMaxWidth)},
      {POPE_CONFIG_KEY(model.context_length), between(1, kMaxLength)},
      {POPE_CONFIG_KEY(model.norm_eps), above_up_to(0, kMaxEpsilon)},
      {POPE_CONFIG_KEY(model.init_std), above_up_to(0, kMaxInitStd)},
      {POPE_CONFIG_KEY(model.position.kind), any(), position_kind_values()},
      {POPE_CONFIG_KEY(model.position.rope.base), above(1)},
      {POPE_CONFIG_KEY(model.position.rope.fraction), fraction()},
      {POPE_CONFIG_KEY(model.position.rope.scaling.kind)},
      {POPE_CONFIG_KEY(model.position.rope.scaling.factor), at_least(1)},
      {POPE_CONFIG_KEY(model.position.rope.scaling.yarn_alpha), at_least(0)},
      {POPE_CONFIG_KEY(model.position.rope.scaling.yarn_beta), above(0)},
      {POPE_CONFIG_KEY(model.position.rope.scaling.yarn_temperature), between(0, kMaxYarnTemperature)},
      {POPE_CONFIG_KEY(model.position.pope.base), above(1)},
      {POPE_CONFIG_KEY(model.position.pope.magnitude)},
      {POPE_CONFIG_KEY(model.position.pope.learn_delta)},
      {POPE_CONFIG_KEY(model.position.pope.delta_init)},
      {POPE_CONFIG_KEY(model.position.pope.delta_bound), {}, {}, Hashed::unless_default},
      {POPE_CONFIG_KEY(model.position.pope.scale)},
      {POPE_CONFIG_KEY(model.position.alibi.head_fraction), fraction()},
      {POPE_CONFIG_KEY(model.position.pj.order), between(0, kMaxPjOrder)},
      {POPE_CONFIG_KEY(model.position.pj.rho)},
      {POPE_CONFIG_KEY(model.position.pj.gate_init)},
      {POPE_CONFIG_KEY(model.position.pj.rotary_order), between(0, kMaxPjOrder)},
      {POPE_CONFIG_KEY(model.position.pj.rotary_eta), at_least(0)},
      {POPE_CONFIG_KEY(model.position.pj.rotary_base), above(1)},
      {POPE_CONFIG_KEY(data.kind)},
      {POPE_CONFIG_KEY(data.train)},
      {POPE_CONFIG_KEY(data.val)},
      {POPE_CONFIG_KEY(data.indirect_indexing.seed), any()},
      {POPE_CONFIG_KEY(data.indirect_indexing.train_size), at_least(1)},
      {POPE_CONFIG_KEY(data.indirect_indexing.val_size), at_least(1)},
      {POPE_CONFIG_KEY(data.indirect_indexing.test_size), at_least(1)},
      // Letters of a source string are distinct, so at most the 52 of the alphabet.
      {POPE_CONFIG_KEY(data.indirect_indexing.min_len), between(2, 52)},
      {POPE_CONFIG_KEY(data.indirect_indexing.max_len), between(2, 52)},
      {POPE_CONFIG_KEY(data.indirect_indexing.max_shift), at_least(0)},
      {POPE_CONFIG_KEY(data.indirect_indexing.zero_shift)},
      {POPE_CONFIG_KEY(optim.lr), above_up_to(0, kMaxLearningRate)},
      {POPE_CONFIG_KEY(optim.min_lr), between(0, kMaxLearningRate)},
      {POPE_CONFIG_KEY(optim.warmup_steps), at_least(0)},
      {POPE_CONFIG_KEY(optim.schedule)},
      {POPE_CONFIG_KEY(optim.beta1), decay_rate()},
      {POPE_CONFIG_KEY(optim.beta2), decay_rate()},
      {POPE_CONFIG_KEY(optim.eps), above_up_to(0, kMaxEpsilon)},
      {POPE_CONFIG_KEY(optim.weight_decay), between(0, kMaxWeightDecay)},
      {POPE_CONFIG_KEY(optim.grad_clip), at_least(0)},
      {POPE_CONFIG_KEY(train.steps), at_least(1), {}, Hashed::no},
      {POPE_CONFIG_KEY(train.batch_size), between(1, kMaxSequences)},
      {POPE_CONFIG_KEY(train.micro_batch_size), between(1, kMaxSequences)},
      {POPE_CONFIG_KEY(train.seq_len), between(1, kMaxLength)},
      {POPE_CONFIG_KEY(train.seed), any()},
      {POPE_CONFIG_KEY(train.log_every), at_least(1), {}, Hashed::no},
      {POPE_CONFIG_KEY(train.eval_every), at_least(0), {}, Hashed::no},
      {POPE_CONFIG_KEY(train.eval_batches), at_least(1), {}, Hashed::no},
      {POPE_CONFIG_KEY(train.checkpoint_every), at_least(0), {}, Hashed::no},
      {POPE_CONFIG_KEY(train.keep_checkpoints), at_least(1), {}, Hashed::no},
      {POPE_CONFIG_KEY(train.max_nonfinite_steps), at_least(0)},
      {POPE_CONFIG_KEY(train.activation_recompute)},
      // A compute mode: the checkpoints are the same, so a run resumes in either precision.
      {POPE_CONFIG_KEY(train.precision), any(), {}, Hashed::no},
      {POPE_CONFIG_KEY(train.fp8_amax_history), between(1, 1024), {}, Hashed::no},
      // Only the last bits of the attention gradients change; a resume may switch it.
      {POPE_CONFIG_KEY(train.deterministic), {}, {}, Hashed::no},
      // How the ranks share the work changes neither the data nor the arithmetic of a step
      // (beyond rounding), and checkpoints hold the whole optimizer state: not hashed, so a
      // run resumes with either setting.
      {POPE_CONFIG_KEY(train.ddp_bucket_mb), between(0, kMaxBucketMib), {}, Hashed::no},
      {POPE_CONFIG_KEY(train.zero_stage), between(0, 1), {}, Hashed::no},
      {POPE_CONFIG_KEY(train.phase_timing), {}, {}, Hashed::no},
      {POPE_CONFIG_KEY(train.device), any(), {}, Hashed::no},
      {POPE_CONFIG_KEY(train.threads), between(0, pope::kMaxThreads), {}, Hashed::no},
      // Samples only read the weights.
      {POPE_CONFIG_KEY(train.sample_every), at_least(0), {}, Hashed::no},
      {POPE_CONFIG_KEY(train.sample_prompt), any(), {}, Hashed::no},
      {POPE_CONFIG_KEY(train.sample_tokens), between(1, kMaxLength), {}, Hashed::no},
      // Either impl computes the same attention up to rounding (like train.deterministic), so a
      // resume may switch it.
      {POPE_CONFIG_KEY(attention.impl), any(), {}, Hashed::no},
      {POPE_CONFIG_KEY(out_dir), any(), {}, Hashed::no},
  };
}

bool starts_with_section(std::string_view path, std::string_view section) {
  return path.size() > section.size() && path.starts_with(section) && path[section.size()] == '.';
}

// The built-in keys with the registered encodings' keys after the other position keys.
std::vector<Field> all_fields() {
  std::vector<Field> table = make_fields();
  const auto data = std::find_if(table.begin(), table.end(), [](const Field& f) { return f.path.starts_with("data."); });
  const std::vector<Field> registered = registered_position_keys();
  table.insert(data, registered.begin(), registered.end());
  return table;
}

}  // namespace

const std::vector<Field>& fields() {
  static const std::vector<Field> table = all_fields();
  return table;
}

std::vector<std::string_view> allowed_names(const Field& field) {
  return std::visit(
      [&](auto access) -> std::vector<std::string_view> {
        using T = std::decay_t<decltype(access(std::declval<RunConfig&>()))>;
        if constexpr (NamedEnum<T>) {
          return {EnumNames<T>::names.begin(), EnumNames<T>::names.end()};
        } else {
          return field.allowed;
        }
      },
      field.access);
}

const Field* find_field(std::string_view path) {
  for (const Field& field : fields()) {
    if (field.path == path) return &field;
  }
  return nullptr;
}

bool is_section(std::string_view path) {
  return std::any_of(fields().begin(), fields().end(),
                     [&](const Field& field) { return starts_with_section(field.path, path); });
}

std::vector<std::string> children_of(std::string_view section) {
  std::vector<std::string> children;
  for (const Field& field : fields()) {
    std::string_view rest = field.path;
    if (!section.empty()) {
      if (!starts_with_section(rest, section)) continue;
      rest.remove_prefix(section.size() + 1);
    }
    std::string child(rest.substr(0, rest.find('.')));
    if (std::find(children.begin(), children.end(), child) == children.end()) children.push_back(child);
  }
  return children;
}

nlohmann::json::json_pointer pointer_to(std::string_view path) {
  std::string pointer = "/";
  for (char c : path) pointer.push_back(c == '.' ? '/' : c);
  return nlohmann::json::json_pointer(pointer);
}

std::string describe(const nlohmann::json& value) {
  constexpr std::size_t kMaxShown = 60;
  std::string shown = value.dump();
  if (shown.size() > kMaxShown) shown = shown.substr(0, kMaxShown) + "…";
  switch (value.type()) {
    case nlohmann::json::value_t::string: return shown + " (a string)";
    case nlohmann::json::value_t::boolean: return shown + " (a boolean)";
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned: return shown + " (an integer)";
    case nlohmann::json::value_t::number_float: return shown + " (a floating-point number)";
    case nlohmann::json::value_t::array: return shown + " (an array)";
    case nlohmann::json::value_t::object: return shown + " (an object)";
    case nlohmann::json::value_t::null: return "null";
    default: return shown;
  }
}

void fail(const std::string& path, const std::string& message, const std::string& source) {
  throw ConfigError(path, source.empty() ? message : fmt::format("{} (in {})", message, source));
}

}  // namespace pope::config_schema
