// pope-export: a trained checkpoint as a folder that PyTorch loads without pope (docs/export.md).
//
// --format hf writes a Hugging Face–style folder:
//   model.safetensors   the weights under pope's parameter names (f32, or bf16 with the
//                       positional parameters kept f32 as pope's CUDA backend keeps them)
//   config.json         model_type "pope", architectures, auto_map, the sizes, and pope's whole
//                       resolved run config under "pope_config"
//   modeling_pope.py    the PyTorch model of every encoding (python/pope_hf/modeling_pope.py,
//                       embedded in the program at build time)
//   vocab.json, merges.txt, tokenizer_config.json, special_tokens_map.json
//                       the GPT-2 tokenizer, for a model with GPT-2's vocabulary
//   README.md           how to load it
// The folder appears whole or not at all: it is written into a hidden sibling directory, every
// file fsync'd, and renamed into place at the end.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace pope {

// Writing the folder failed (disk full, permissions) or was interrupted; nothing is left at
// the destination. The message names the path.
class ExportError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A stop request (SIGINT/SIGTERM) seen between two files; the staging directory is removed.
class ExportInterrupted : public ExportError {
 public:
  using ExportError::ExportError;
};

enum class ExportDtype { f32, bf16 };

enum class ExportTokenizer {
  automatic,  // the GPT-2 files for a model with GPT-2's 50,257-token vocabulary, none otherwise
  required,   // from `tokenizer_dir`; refused for a model without GPT-2's vocabulary
  none,
};

struct HfExportOptions {
  std::filesystem::path checkpoint;          // run directory (its newest checkpoint) or step directory
  std::filesystem::path out;                 // the folder to create: absent or an empty directory
  ExportDtype dtype = ExportDtype::f32;
  std::vector<std::string> overrides;        // "model.KEY=VALUE", as pope-eval --set
  ExportTokenizer tokenizer = ExportTokenizer::automatic;
  std::filesystem::path tokenizer_dir;       // empty: as find_tokenizer_dir (pope/tokenizer.hpp)
  // Asked between files; true stops the export (ExportInterrupted), leaving nothing behind.
  std::function<bool()> stop_requested;
};

struct HfExportResult {
  std::filesystem::path out;                 // absolute
  std::filesystem::path step_dir;            // the checkpoint exported
  long step = 0;
  std::string position;                      // model.position.kind
  std::int64_t parameters = 0;               // trainable (padded embedding rows excluded)
  std::vector<std::string> files;            // written, in order
  std::filesystem::path tokenizer_dir;       // empty when no tokenizer files were written
};

// Refuses a destination the export would not write (ConfigError naming "--out"): not absent
// and not an empty directory, a symbolic link, a directory that does not exist or is not
// writable above it. Checked again by export_hf; callers check it first to refuse early.
void check_export_destination(const std::filesystem::path& out);

// Writes the folder. Throws ConfigError (options, the run's config), CheckpointError (a missing,
// incomplete or mismatched checkpoint), TokenizerError (missing or corrupt tokenizer files),
// ExportError (writing; ExportInterrupted on a stop request).
HfExportResult export_hf(const HfExportOptions& options);

// The modeling file the folder gets (python/pope_hf/modeling_pope.py as built in).
std::string_view embedded_modeling_file();

}  // namespace pope
