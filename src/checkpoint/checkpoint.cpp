// Trainer checkpoints: one directory per step holding model.safetensors (fp32 weights by
// parameter name), optimizer.safetensors ("m.<name>", "v.<name>") and trainer.json.
#include <fmt/format.h>
#include <fmt/std.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "checkpoint/atomic_file.hpp"
#include "config/bounded_json.hpp"
#include "data/regular_file.hpp"
#include "pope/checkpoint.hpp"

namespace pope {

namespace fs = std::filesystem;

namespace {

constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kTrainerFile = "trainer.json";
constexpr const char* kTrainerCheckpointFiles[] = {kModelFile, kOptimizerFile, kTrainerFile};
constexpr const char* kStepPrefix = "step_";
constexpr const char* kFormatName = "pope";

std::string step_dir_name(long step) { return fmt::format("{}{:08d}", kStepPrefix, step); }

// "step_00001000" → 1000; anything else (including "step_00001000.tmp") → nullopt.
std::optional<long> parse_step_dir_name(const std::string& name) {
  const std::string prefix = kStepPrefix;
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  long step = 0;
  const char* first = name.data() + prefix.size();
  const char* last = name.data() + name.size();
  const auto [end, error] = std::from_chars(first, last, step);
  if (error != std::errc() || end != last || *first == '-' || *first == '+') return std::nullopt;
  return step;
}

struct StepDir {
  long step;
  fs::path path;
};

// Directories named step_<digits> under `checkpoints` (complete or not), newest first.
std::vector<StepDir> step_dirs(const fs::path& checkpoints) {
  std::vector<StepDir> dirs;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(checkpoints, ec)) {
    if (!entry.is_directory()) continue;
    if (auto step = parse_step_dir_name(entry.path().filename().string())) dirs.push_back({*step, entry.path()});
  }
  std::sort(dirs.begin(), dirs.end(), [](const StepDir& a, const StepDir& b) { return a.step > b.step; });
  return dirs;
}

// Leftovers of an interrupted save: "<step dir>.tmp" (being written), "<step dir>.old" (being
// replaced) and "<step dir>.deleting" (being pruned). None is ever a valid checkpoint.
bool is_leftover_dir_name(const std::string& name) {
  for (const char* suffix : {".tmp", ".old", ".deleting"}) {
    const std::string s = suffix;
    if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0 &&
        parse_step_dir_name(name.substr(0, name.size() - s.size())))
      return true;
  }
  return false;
}

void remove_leftovers(const fs::path& checkpoints) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(checkpoints, ec))
    if (entry.is_directory() && is_leftover_dir_name(entry.path().filename().string())) fs::remove_all(entry.path(), ec);
}

template <class Action>
void checked_fs(const std::string& what, Action action) {
  std::error_code ec;
  action(ec);
  if (ec) throw CheckpointError(fmt::format("cannot {}: {}", what, ec.message()));
}

void sync_directory(const fs::path& directory) {
  try {
    fsync_directory(directory);
  } catch (const AtomicWriteError& error) {
    throw CheckpointError(error.what());
  }
}

// Deletes all but the newest `keep_last` step directories; `keep` (the one just written)
// always survives and counts towards the limit.
void prune(const fs::path& checkpoints, const fs::path& keep, int keep_last) {
  int kept = 1;
  for (const auto& dir : step_dirs(checkpoints)) {
    if (dir.path.filename() == keep.filename()) continue;
    if (kept < keep_last) {
      ++kept;
      continue;
    }
    // Renamed first: a crash while its files go must not leave a step directory missing one.
    fs::path doomed = dir.path;
    doomed += ".deleting";
    checked_fs(fmt::format("rename old checkpoint {} to {}", dir.path, doomed),
               [&](std::error_code& ec) { fs::rename(dir.path, doomed, ec); });
    sync_directory(checkpoints);
    checked_fs(fmt::format("remove old checkpoint {}", doomed), [&](std::error_code& ec) { fs::remove_all(doomed, ec); });
  }
}

// ---- tensors <-> flat arena --------------------------------------------------------------

std::vector<SafetensorsTensor> tensors_from_arena(const ParameterLayout& layout, const std::vector<float>& flat,
                                                  const std::string& prefix) {
  std::vector<SafetensorsTensor> tensors;
  for (std::size_t i = 0; i < layout.specs().size(); ++i) {
    const auto& spec = layout.specs()[i];
    const auto* begin = reinterpret_cast<const std::uint8_t*>(flat.data() + layout.offset(i));
    tensors.push_back({prefix + spec.name, DType::f32, spec.shape,
                       std::vector<std::uint8_t>(begin, begin + shape_numel(spec.shape) * sizeof(float))});
  }
  return tensors;
}

// "N <what> values (the first at element E)" for the values failing `good`, or nullopt.
template <class Good>
std::optional<std::string> bad_values(const float* values, std::size_t count, const char* what, Good good) {
  const float* first_bad = std::find_if_not(values, values + count, good);
  if (first_bad == values + count) return std::nullopt;
  return fmt::format("{} {} values (the first at element {})",
                     std::count_if(first_bad, values + count, [&](float v) { return !good(v); }), what,
                     first_bad - values);
}

std::optional<std::string> non_finite_values(const float* values, std::size_t count) {
  return bad_values(values, count, "non-finite", [](float v) { return std::isfinite(v); });
}

// AdamW's second moments are running means of squared gradients.
constexpr const char* kSecondMomentPrefix = "v.";

// Fills the arena from the tensors named `prefix` + parameter name, each F32 with the
// layout's shape.
std::vector<float> arena_from_tensors(const ParameterLayout& layout, const SafetensorsContents& contents,
                                      const std::string& prefix, const fs::path& file) {
  std::vector<float> flat(static_cast<std::size_t>(layout.total_numel()), 0.0f);
  for (std::size_t i = 0; i < layout.specs().size(); ++i) {
    const auto& spec = layout.specs()[i];
    const std::string name = prefix + spec.name;
    const auto found = std::find_if(contents.tensors.begin(), contents.tensors.end(),
                                    [&](const SafetensorsTensor& t) { return t.name == name; });
    if (found == contents.tensors.end())
      throw CheckpointError(fmt::format("checkpoint file {} has no tensor '{}' (expected shape {})", file, name,
                                        shape_string(spec.shape)));
    if (found->shape != spec.shape)
      throw CheckpointError(fmt::format("checkpoint file {}: tensor '{}' has shape {}, expected {}", file, name,
                                        shape_string(found->shape), shape_string(spec.shape)));
    if (found->dtype != DType::f32)
      throw CheckpointError(fmt::format("checkpoint file {}: tensor '{}' has dtype {}, expected f32", file, name,
                                        dtype_name(found->dtype)));
    float* values = flat.data() + layout.offset(i);
    std::memcpy(values, found->bytes.data(), found->bytes.size());
    // Saving refuses NaN and infinity, so one here is damage to the file (the format has no
    // checksum); evaluating or resuming from it would print NaN perplexities or train on garbage.
    if (const auto bad = non_finite_values(values, found->bytes.size() / sizeof(float)))
      throw CheckpointError(fmt::format("checkpoint file {}: tensor '{}' has {}; training never writes them, so the "
                                        "file is damaged",
                                        file, name, *bad));
    if (prefix == kSecondMomentPrefix)
      if (const auto bad = bad_values(values, found->bytes.size() / sizeof(float), "negative",
                                      [](float v) { return v >= 0.0f; }))
        throw CheckpointError(fmt::format("checkpoint file {}: tensor '{}' has {}, expected AdamW second moments "
                                          ">= 0 (means of squared gradients), so the file is damaged",
                                          file, name, *bad));
  }
  return flat;
}

// Refuses to save a NaN or infinity (a diverged run, e.g. a far too large optim.lr): a resume
// or evaluation could only refuse it later, and it would pass for the last good checkpoint.
void check_arena_finite(const ParameterLayout& layout, const std::vector<float>& flat, const std::string& prefix,
                        long step) {
  for (std::size_t i = 0; i < layout.specs().size(); ++i) {
    const auto& spec = layout.specs()[i];
    if (const auto bad = non_finite_values(flat.data() + layout.offset(i), std::size_t(shape_numel(spec.shape))))
      throw CheckpointError(fmt::format("step {}: tensor '{}{}' has {}; no checkpoint written (those already saved "
                                        "are kept): the run diverged, lower optim.lr or check the data",
                                        step, prefix, spec.name, *bad));
  }
}

// A tensor the model does not know means the checkpoint belongs to another model (or
// another encoding); loading the rest would silently drop trained weights.
void check_no_unknown_tensors(const ParameterLayout& layout, const SafetensorsContents& contents,
                              const std::vector<std::string>& prefixes, const fs::path& file) {
  std::set<std::string> expected;
  for (const auto& prefix : prefixes)
    for (const auto& spec : layout.specs()) expected.insert(prefix + spec.name);
  std::vector<std::string> unknown;
  for (const auto& t : contents.tensors)
    if (!expected.contains(t.name)) unknown.push_back(t.name);
  if (!unknown.empty())
    throw CheckpointError(fmt::format("checkpoint file {} has tensors the model does not have: {}", file,
                                      fmt::join(unknown, ", ")));
}

void check_arena_size(const ParameterLayout& layout, const std::vector<float>& flat, const std::string& what) {
  if (flat.size() != static_cast<std::size_t>(layout.total_numel()))
    throw CheckpointError(fmt::format("cannot save checkpoint: {} has {} elements, the parameter layout needs {}", what,
                                      flat.size(), layout.total_numel()));
}

std::string read_text_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError(fmt::format("cannot read {}", path));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Writes every file of a checkpoint into `dir` (each fsync'd, see write_bytes_atomic).
void write_step_files(const fs::path& dir, const ParameterLayout& layout, const CheckpointData& data) {
  const std::map<std::string, std::string> metadata{{"format", kFormatName},
                                                    {"step", std::to_string(data.state.step)}};
  write_safetensors(dir / kModelFile, tensors_from_arena(layout, data.params, ""), metadata);
  if (!data.adam_m.empty()) {
    auto tensors = tensors_from_arena(layout, data.adam_m, "m.");
    auto v = tensors_from_arena(layout, data.adam_v, kSecondMomentPrefix);
    tensors.insert(tensors.end(), std::make_move_iterator(v.begin()), std::make_move_iterator(v.end()));
    write_safetensors(dir / kOptimizerFile, tensors, metadata);
  }
  write_file_atomic(dir / kTrainerFile, data.state.to_json().dump(2) + "\n");
}

// ---- trainer.json fields -----------------------------------------------------------------

[[noreturn]] void bad_field(const std::string& source, const std::string& key, const nlohmann::json& value,
                            const std::string& expected) {
  throw CheckpointError(fmt::format("{}: \"{}\" is {}, expected {}", source, key,
                                    value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), expected));
}

const nlohmann::json& field(const nlohmann::json& json, const std::string& key, const std::string& source) {
  if (!json.contains(key)) throw CheckpointError(fmt::format("{}: missing \"{}\"", source, key));
  return json[key];
}

// A non-negative integer no larger than `max`; JSON parsed from text holds such numbers as
// unsigned, JSON built in code may hold them as signed.
std::uint64_t non_negative_integer(const nlohmann::json& json, const std::string& key, const std::string& source,
                                   std::uint64_t max) {
  const auto& value = field(json, key, source);
  const bool in_range = value.is_number_unsigned() || (value.is_number_integer() && value.get<std::int64_t>() >= 0);
  if (!in_range || value.get<std::uint64_t>() > max)
    bad_field(source, key, value, fmt::format("an integer in [0, {}]", max));
  return value.get<std::uint64_t>();
}

// The RNG words are written as decimal strings: JSON readers that hold numbers as
// doubles (Python's is fine, JavaScript's is not) would round 64-bit values.
std::uint64_t parse_rng_word(const nlohmann::json& value, const std::string& source) {
  if (value.is_number_unsigned()) return value.get<std::uint64_t>();
  if (value.is_string()) {
    const auto& text = value.get_ref<const std::string&>();
    std::uint64_t word = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), word);
    if (!text.empty() && error == std::errc() && end == text.data() + text.size()) return word;
  }
  bad_field(source, "rng", value, "four unsigned 64-bit integers as decimal strings");
}

}  // namespace

// ---- TrainerState ----------------------------------------------------------------------

nlohmann::json TrainerState::to_json() const {
  nlohmann::json rng_words = nlohmann::json::array();
  for (auto word : rng) rng_words.push_back(std::to_string(word));
  return {{"step", step},
          {"samples_consumed", samples_consumed},
          {"rng", rng_words},
          {"config_hash", config_hash},
          {"consecutive_nonfinite", consecutive_nonfinite},
          // JSON has no NaN or infinity: a non-finite loss is written as null and read back as NaN.
          {"last_val_loss", std::isfinite(last_val_loss) ? nlohmann::json(last_val_loss) : nlohmann::json(nullptr)}};
}

TrainerState TrainerState::from_json(const nlohmann::json& json, const std::string& source) {
  if (!json.is_object()) throw CheckpointError(fmt::format("{}: expected a JSON object", source));
  TrainerState state;

  state.step = static_cast<long>(non_negative_integer(json, "step", source, std::numeric_limits<long>::max()));
  state.samples_consumed =
      non_negative_integer(json, "samples_consumed", source, std::numeric_limits<std::uint64_t>::max());

  const auto& rng = field(json, "rng", source);
  if (!rng.is_array() || rng.size() != state.rng.size()) bad_field(source, "rng", rng, "an array of four words");
  for (std::size_t i = 0; i < state.rng.size(); ++i) state.rng[i] = parse_rng_word(rng[i], source);
  // xoshiro256** never leaves, and never reaches, the all-zero state.
  if (std::all_of(state.rng.begin(), state.rng.end(), [](std::uint64_t word) { return word == 0; }))
    bad_field(source, "rng", rng, "a xoshiro256** state, which is never all zeros");

  const auto& hash = field(json, "config_hash", source);
  if (!hash.is_string()) bad_field(source, "config_hash", hash, "a string");
  state.config_hash = hash.get<std::string>();

  state.consecutive_nonfinite = static_cast<int>(
      non_negative_integer(json, "consecutive_nonfinite", source, std::numeric_limits<int>::max()));

  const auto& loss = field(json, "last_val_loss", source);
  // A cross-entropy: never negative.
  if (!loss.is_null() && !(loss.is_number() && loss.get<double>() >= 0.0))
    bad_field(source, "last_val_loss", loss, "a number >= 0 or null");
  state.last_val_loss = loss.is_null() ? std::numeric_limits<double>::quiet_NaN() : loss.get<double>();
  return state;
}

void check_trainer_state(const TrainerState& state, const TrainerStateLimits& limits, const std::string& source) {
  if (state.step > limits.steps)
    bad_field(source, "step", state.step,
              fmt::format("at most train.steps = {} (a run is not shortened below the step it reached: set "
                          "train.steps >= {})",
                          limits.steps, state.step));
  // Every step, applied or skipped, draws one global batch.
  const auto batch = std::uint64_t(limits.batch_size);
  if (state.samples_consumed % batch != 0 || state.samples_consumed / batch != std::uint64_t(state.step))
    bad_field(source, "samples_consumed", state.samples_consumed,
              fmt::format("step × train.batch_size = {} × {} = {}", state.step, limits.batch_size,
                          std::uint64_t(state.step) * batch));
  // The run aborts when the count reaches the limit (a limit of 0 at the first), so a
  // checkpoint never holds that many.
  const int allowed = std::max(limits.max_nonfinite_steps, 1) - 1;
  if (state.consecutive_nonfinite > allowed)
    bad_field(source, "consecutive_nonfinite", state.consecutive_nonfinite,
              fmt::format("at most {} (the run aborts at train.max_nonfinite_steps = {})", allowed,
                          limits.max_nonfinite_steps));
}

// ---- save / load -----------------------------------------------------------------------

fs::path check_checkpoint_directory(const fs::path& run_dir) {
  const fs::path checkpoints = run_dir / "checkpoints";
  std::error_code ec;
  const fs::file_status status = fs::status(checkpoints, ec);
  if (fs::exists(status) && !fs::is_directory(status))
    throw CheckpointError(fmt::format("{} exists and is not a directory; checkpoints are written there, so move it "
                                      "away or choose another --out",
                                      checkpoints));
  return checkpoints;
}

fs::path create_checkpoint_directory(const fs::path& run_dir) {
  const fs::path checkpoints = check_checkpoint_directory(run_dir);
  checked_fs(fmt::format("create {}", checkpoints), [&](std::error_code& error) { fs::create_directories(checkpoints, error); });
  return checkpoints;
}

fs::path save_checkpoint(const fs::path& run_dir, const ParameterLayout& layout, const CheckpointData& data,
                         int keep_last) {
  if (keep_last < 1) throw CheckpointError(fmt::format("checkpoint keep_last must be at least 1, got {}", keep_last));
  if (data.state.step < 0) throw CheckpointError(fmt::format("cannot save a checkpoint for step {}", data.state.step));
  check_arena_size(layout, data.params, "params");
  check_arena_finite(layout, data.params, "", data.state.step);
  if (!data.adam_m.empty() || !data.adam_v.empty()) {
    check_arena_size(layout, data.adam_m, "adam_m");
    check_arena_size(layout, data.adam_v, "adam_v");
    check_arena_finite(layout, data.adam_m, "m.", data.state.step);
    check_arena_finite(layout, data.adam_v, kSecondMomentPrefix, data.state.step);
  }

  const fs::path checkpoints = create_checkpoint_directory(run_dir);
  remove_leftovers(checkpoints);

  const std::string name = step_dir_name(data.state.step);
  const fs::path final_dir = checkpoints / name;
  const fs::path temp_dir = checkpoints / (name + ".tmp");
  const fs::path old_dir = checkpoints / (name + ".old");
  checked_fs(fmt::format("create {}", temp_dir), [&](std::error_code& ec) { fs::create_directory(temp_dir, ec); });
  try {
    write_step_files(temp_dir, layout, data);
  } catch (...) {
    std::error_code ignored;  // a failed save (a full disk) must not keep its partial copy there
    fs::remove_all(temp_dir, ignored);
    throw;
  }

  // Re-saving a step: move the old directory aside first, so that a crash at any point
  // leaves either the old or the new checkpoint complete under some name.
  const bool replacing = fs::exists(final_dir);
  if (replacing)
    checked_fs(fmt::format("move {} aside", final_dir), [&](std::error_code& ec) { fs::rename(final_dir, old_dir, ec); });
  checked_fs(fmt::format("rename {} to {}", temp_dir, final_dir),
             [&](std::error_code& ec) { fs::rename(temp_dir, final_dir, ec); });
  sync_directory(checkpoints);
  if (replacing) checked_fs(fmt::format("remove {}", old_dir), [&](std::error_code& ec) { fs::remove_all(old_dir, ec); });

  prune(checkpoints, final_dir, keep_last);
  return final_dir;
}

std::optional<fs::path> latest_checkpoint(const fs::path& run_dir) {
  // Every file the trainer writes: a directory that lost one (deleted by hand, or by a pruning
  // before they were renamed away first) is not a checkpoint to resume or evaluate.
  const auto complete = [](const fs::path& dir) {
    return std::all_of(std::begin(kTrainerCheckpointFiles), std::end(kTrainerCheckpointFiles),
                       [&](const char* file) { return fs::is_regular_file(dir / file); });
  };
  for (const auto& dir : step_dirs(run_dir / "checkpoints"))
    if (complete(dir.path)) return dir.path;
  return std::nullopt;
}

fs::path checkpoint_step_directory(const fs::path& path) {
  if (!fs::is_directory(path))
    throw CheckpointError(fmt::format("checkpoint {} does not exist or is not a directory", path));
  if (!fs::is_directory(path / "checkpoints")) return path;
  const auto latest = latest_checkpoint(path);
  if (!latest) throw CheckpointError(fmt::format("run directory {} has no complete checkpoint under checkpoints/", path));
  return *latest;
}

CheckpointLocation locate_checkpoint(const fs::path& path) {
  CheckpointLocation paths;
  paths.step_dir = checkpoint_step_directory(path);
  if (paths.step_dir != path) {
    paths.config_file = path / "config.json";
  } else {
    if (!fs::is_regular_file(path / "model.safetensors"))
      throw CheckpointError(fmt::format("checkpoint {} is neither a run directory (no checkpoints/ inside) nor a step "
                                        "directory (no model.safetensors inside)",
                                        path));
    fs::path step = fs::absolute(path).lexically_normal();
    if (!step.has_filename()) step = step.parent_path();  // "…/step_N/" names the same directory
    paths.config_file = step.parent_path().parent_path() / "config.json";
  }
  if (const std::string why = why_not_regular_file(paths.config_file); !why.empty())
    throw CheckpointError(fmt::format("checkpoint {}: the run's config {} {} (expected a run directory or "
                                      "<run>/checkpoints/step_N with <run>/config.json)",
                                      path, paths.config_file, why));
  return paths;
}

TrainerState read_trainer_state(const fs::path& step_dir) {
  const fs::path trainer_file = step_dir / kTrainerFile;
  if (const std::string why = why_not_regular_file(trainer_file); !why.empty())
    throw CheckpointError(fmt::format("checkpoint {} is incomplete: {} {}", step_dir, kTrainerFile, why));
  nlohmann::json state_json;
  try {
    state_json = parse_json(read_text_file(trainer_file));
  } catch (const nlohmann::json::exception& error) {
    throw CheckpointError(fmt::format("{} is not valid JSON: {}", trainer_file, error.what()));
  }
  TrainerState state = TrainerState::from_json(state_json, trainer_file.string());
  const std::optional<long> named = parse_step_dir_name(step_dir.filename().string());
  if (named && *named != state.step)
    throw CheckpointError(fmt::format("{} says step {}, but its directory is {}: the checkpoint was altered or "
                                      "copied over another; expected step {}",
                                      trainer_file, state.step, step_dir.filename().string(), *named));
  return state;
}

CheckpointData load_checkpoint(const fs::path& path, const ParameterLayout& layout, bool weights_only) {
  const fs::path step_dir = checkpoint_step_directory(path);

  std::vector<std::string> required{kModelFile};
  if (!weights_only) required.push_back(kTrainerFile);
  std::vector<std::string> missing;  // "FILE does not exist", "FILE is a FIFO (named pipe), not a regular file", …
  for (const auto& file : required)
    if (const std::string why = why_not_regular_file(step_dir / file); !why.empty()) missing.push_back(file + " " + why);
  if (!missing.empty())
    throw CheckpointError(fmt::format("checkpoint {} is incomplete: {}", step_dir, fmt::join(missing, "; ")));

  CheckpointData data;
  const fs::path model_file = step_dir / kModelFile;
  const auto model = read_safetensors(model_file);
  check_no_unknown_tensors(layout, model, {""}, model_file);
  data.params = arena_from_tensors(layout, model, "", model_file);
  if (weights_only) return data;

  data.state = read_trainer_state(step_dir);

  // A checkpoint saved without optimizer state resumes with fresh moments (left empty here).
  const fs::path optimizer_file = step_dir / kOptimizerFile;
  if (fs::exists(optimizer_file)) {
    const auto moments = read_safetensors(optimizer_file);
    check_no_unknown_tensors(layout, moments, {"m.", kSecondMomentPrefix}, optimizer_file);
    data.adam_m = arena_from_tensors(layout, moments, "m.", optimizer_file);
    data.adam_v = arena_from_tensors(layout, moments, kSecondMomentPrefix, optimizer_file);
  }
  return data;
}

}  // namespace pope
