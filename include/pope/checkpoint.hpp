// Checkpoints: weights as safetensors (readable by any safetensors reader), optimizer
// moments as a second safetensors file, trainer state as JSON — one directory per step,
// written atomically (temp directory, fsync every file, rename), the last N kept (each renamed
// to a non-checkpoint name before its files are deleted).
//
// Layout of a run directory:
//   <run>/config.json                 resolved config
//   <run>/metrics.jsonl               one JSON object per log/eval event
//   <run>/checkpoints/step_00001000/  model.safetensors  optimizer.safetensors  trainer.json
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pope/rng.hpp"
#include "pope/tensor.hpp"

namespace pope {

// A missing, truncated or inconsistent checkpoint; the message names the file.
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// ---- safetensors -------------------------------------------------------------------
// File: u64 little-endian header length, JSON header {name: {dtype, shape, data_offsets},
// "__metadata__": {string: string}}, then the raw little-endian data.
struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::f32;   // F32, F64, BF16, I32, U16 on disk
  Shape shape;
  std::vector<std::uint8_t> bytes;
};

// Atomic write (temp + fsync + rename). Throws CheckpointError.
void write_safetensors(const std::filesystem::path& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});
// Reads and validates (header JSON, offsets inside the file and non-overlapping, sizes
// match dtype × shape). Throws CheckpointError naming the file and the problem.
struct SafetensorsContents {
  std::vector<SafetensorsTensor> tensors;
  std::map<std::string, std::string> metadata;
  const SafetensorsTensor& at(const std::string& name) const;  // throws CheckpointError
};
SafetensorsContents read_safetensors(const std::filesystem::path& path);

// ---- trainer checkpoints -----------------------------------------------------------
struct TrainerState {
  long step = 0;                        // optimizer steps completed
  std::uint64_t samples_consumed = 0;   // training sampler position (global sample index)
  Rng::State rng{};                     // trainer RNG (reserved for stochastic features)
  std::string config_hash;              // hash of the resolved config that produced it
  int consecutive_nonfinite = 0;
  double last_val_loss = 0.0;
  nlohmann::json to_json() const;
  static TrainerState from_json(const nlohmann::json& json, const std::string& source);
};

// What the run's config allows in a trainer.json (the trainer's train.* keys).
struct TrainerStateLimits {
  long steps = 0;                // train.steps: the step reached is at most this
  int batch_size = 1;            // train.batch_size: samples_consumed = step × batch_size
  int max_nonfinite_steps = 1;   // train.max_nonfinite_steps: consecutive_nonfinite stays below it
};
// Throws CheckpointError naming `source`, the field and what was expected.
void check_trainer_state(const TrainerState& state, const TrainerStateLimits& limits, const std::string& source);

// Host copies of everything a checkpoint holds. Parameters are stored per name (the
// layout's specs) in fp32; m and v likewise under "m.<name>", "v.<name>".
struct CheckpointData {
  TrainerState state;
  std::vector<float> params;   // flat, in the layout's arena order (padding included, zeros)
  std::vector<float> adam_m;   // empty when weights-only
  std::vector<float> adam_v;
};

// Writes <run_dir>/checkpoints/step_<step>/ atomically and deletes all but the newest
// `keep_last` step directories. Returns the directory written.
std::filesystem::path save_checkpoint(const std::filesystem::path& run_dir, const ParameterLayout& layout,
                                      const CheckpointData& data, int keep_last);

// Creates <run_dir>/checkpoints when missing and returns it. Throws CheckpointError when it
// cannot, e.g. a file in its place: the trainer calls it at start, not only at the first save.
std::filesystem::path create_checkpoint_directory(const std::filesystem::path& run_dir);
// Its check alone, creating nothing (pope-train --dry-run): returns <run_dir>/checkpoints.
std::filesystem::path check_checkpoint_directory(const std::filesystem::path& run_dir);

// The step directory `path` names: itself, or a run directory's newest complete one. Throws
// CheckpointError when `path` is no directory or a run directory without a complete checkpoint.
std::filesystem::path checkpoint_step_directory(const std::filesystem::path& path);

// `path` is a step directory or a run directory (then its newest checkpoint). Checks every
// tensor of `layout` is present with its shape and finite, and the second moments >= 0.
// weights_only skips optimizer and state.
CheckpointData load_checkpoint(const std::filesystem::path& path, const ParameterLayout& layout,
                               bool weights_only = false);

// The trainer.json of a step directory. Its step must be the one the directory is named for
// (step_N): resuming or reporting another step than the weights' would be silently wrong.
TrainerState read_trainer_state(const std::filesystem::path& step_dir);

// Newest complete step directory under <run_dir>/checkpoints, if any: one holding all three
// files (a weights-only directory is read through its own path only).
std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& run_dir);

// What a checkpoint path names: a run directory (then its newest complete step directory) or a
// step directory <run>/checkpoints/step_N, and the run's config.json (<run>/config.json). Throws
// CheckpointError when the path is neither or the config is missing.
struct CheckpointLocation {
  std::filesystem::path step_dir, config_file;
};
CheckpointLocation locate_checkpoint(const std::filesystem::path& path);

// fsync'd atomic write of a small text file (config.json, trainer.json).
void write_file_atomic(const std::filesystem::path& path, const std::string& contents);

}  // namespace pope
