// export_hf: a checkpoint as a Hugging Face–style folder (include/pope/export.hpp,
// docs/export.md). Everything is assembled in memory first (weights, config.json, tokenizer
// files, README), then written into a hidden staging directory beside the destination, each
// file fsync'd (write_bytes_atomic, as checkpoints), and the directory renamed into place.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/std.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <system_error>

#include "checkpoint/atomic_file.hpp"
#include "data/gpt2_vocabulary.hpp"
#include "model/bf16.hpp"
#include "pope/checkpoint.hpp"
#include "pope/config.hpp"
#include "pope/eval.hpp"
#include "pope/export.hpp"
#include "pope/model.hpp"
#include "pope/position.hpp"
#include "pope/tokenizer.hpp"

namespace pope {

namespace generated {
std::string_view modeling_pope_py();  // embedded at build time (src/export/embed_file.cmake)
}  // namespace generated

std::string_view embedded_modeling_file() { return generated::modeling_pope_py(); }

namespace {

namespace fs = std::filesystem;

constexpr int kFormatVersion = 1;  // modeling_pope.FORMAT_VERSION reads up to this
constexpr const char* kStagingMarker = ".pope-export-";
constexpr const char* kEndOfText = "<|endoftext|>";

// ---- the destination ---------------------------------------------------------------------

fs::path absolute_destination(const fs::path& out) {
  if (out.empty()) throw ConfigError("--out", "the folder to write is required");
  std::error_code error;
  fs::path path = fs::absolute(out, error);
  if (error) throw ConfigError("--out", fmt::format("cannot resolve {}: {}", out, error.message()));
  path = path.lexically_normal();
  if (!path.has_filename()) path = path.parent_path();  // "dir/" names dir
  if (path.filename().empty() || path == path.root_path() || path.filename() == "..")
    throw ConfigError("--out", fmt::format("{} is not a folder that can be created", out));
  return path;
}

// "<parent>/.<name>.pope-export-" — the prefix of every staging directory of `out`.
std::string staging_prefix(const fs::path& out) {
  return fmt::format(".{}{}", out.filename().string(), kStagingMarker);
}

// Removes staging directories of `out` left by exports that were killed (their pid is gone).
void remove_stale_staging(const fs::path& out) {
  const std::string prefix = staging_prefix(out);
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(out.parent_path(), error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    long pid = 0;
    const char* first = name.data() + prefix.size();
    const auto [end, parse_error] = std::from_chars(first, name.data() + name.size(), pid);
    if (parse_error != std::errc() || end == first || *end != '-' || pid <= 0) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to judge
    std::error_code remove_error;
    fs::remove_all(entry.path(), remove_error);
    if (!remove_error) spdlog::info("removed {}, left by an export that was stopped (process {})", entry.path(), pid);
  }
}

// A directory beside the destination that becomes it on commit(); removed unless committed.
class StagingDirectory {
 public:
  explicit StagingDirectory(const fs::path& out) : out_(out) {
    std::string pattern = (out.parent_path() / fmt::format("{}{}-XXXXXX", staging_prefix(out), ::getpid())).string();
    if (::mkdtemp(pattern.data()) == nullptr)
      throw ExportError(fmt::format("cannot create a staging directory beside {}: {}", out, std::strerror(errno)));
    path_ = pattern;
  }
  StagingDirectory(const StagingDirectory&) = delete;
  StagingDirectory& operator=(const StagingDirectory&) = delete;
  ~StagingDirectory() {
    if (committed_) return;
    std::error_code error;
    fs::remove_all(path_, error);
  }

  const fs::path& path() const { return path_; }

  void commit() {
    // mkdtemp makes the directory 0700; give it what mkdir would have.
    const mode_t mask = ::umask(0);
    ::umask(mask);
    if (::chmod(path_.c_str(), 0777 & ~mask) != 0)
      throw ExportError(fmt::format("cannot set the permissions of {}: {}", path_, std::strerror(errno)));
    try {
      fsync_directory(path_);
      // rename(2) replaces an empty directory and refuses a non-empty one.
      if (::rename(path_.c_str(), out_.c_str()) != 0) {
        const int code = errno;
        if (code == ENOTEMPTY || code == EEXIST)
          throw ExportError(fmt::format("{} was filled by someone else while the export ran; the export is left "
                                        "unwritten",
                                        out_));
        throw ExportError(fmt::format("cannot rename {} to {}: {}", path_, out_, std::strerror(code)));
      }
      committed_ = true;
      fsync_directory(out_.parent_path());
    } catch (const AtomicWriteError& error) {
      if (!committed_) throw ExportError(error.what());
      throw ExportError(fmt::format("{} is complete, but its parent directory could not be synced: {}", out_,
                                    error.what()));
    }
  }

 private:
  fs::path out_, path_;
  bool committed_ = false;
};

// ---- the folder's contents ---------------------------------------------------------------

struct OutputFile {
  std::string name;
  std::string text;                          // every file but the weights
  std::vector<SafetensorsTensor> tensors;    // model.safetensors
  std::map<std::string, std::string> metadata;
};

bool is_positional(const std::string& name) { return name.find(".position.") != std::string::npos; }

std::vector<SafetensorsTensor> weight_tensors(const ParameterLayout& layout, const std::vector<float>& flat,
                                              ExportDtype dtype) {
  std::vector<SafetensorsTensor> tensors;
  for (std::size_t i = 0; i < layout.specs().size(); ++i) {
    const ParamSpec& spec = layout.specs()[i];
    const float* values = flat.data() + layout.offset(i);
    const auto count = static_cast<std::size_t>(shape_numel(spec.shape));
    SafetensorsTensor tensor{spec.name, DType::f32, spec.shape, {}};
    // The positional parameters stay f32 in a bf16 export: pope's CUDA backend reads them from
    // the f32 master weights (Model::master_read_ranges), and a rounded PJ frequency ω would turn
    // the phase ω·Δ of long lags.
    if (dtype == ExportDtype::bf16 && !is_positional(spec.name)) {
      tensor.dtype = DType::bf16;
      tensor.bytes.resize(count * sizeof(std::uint16_t));
      for (std::size_t k = 0; k < count; ++k) {
        const std::uint16_t bits = float_to_bf16(values[k]);
        std::memcpy(tensor.bytes.data() + k * sizeof bits, &bits, sizeof bits);
      }
    } else {
      tensor.bytes.resize(count * sizeof(float));
      std::memcpy(tensor.bytes.data(), values, tensor.bytes.size());
    }
    tensors.push_back(std::move(tensor));
  }
  return tensors;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw TokenizerError(fmt::format("{}: cannot open", path));
  std::ostringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) throw TokenizerError(fmt::format("{}: cannot read", path));
  return text.str();
}

const char* torch_dtype_name(ExportDtype dtype) { return dtype == ExportDtype::bf16 ? "bfloat16" : "float32"; }
const char* short_dtype_name(ExportDtype dtype) { return dtype == ExportDtype::bf16 ? "bf16" : "f32"; }

nlohmann::ordered_json hf_config(const EvalCheckpoint& checkpoint, const TrainerState& state,
                                 const HfExportOptions& options, bool gpt2_vocabulary) {
  const RunConfig& config = checkpoint.config;
  const ModelConfig& m = config.model;
  nlohmann::ordered_json j;
  j["model_type"] = "pope";
  j["architectures"] = {"PopeForCausalLM"};
  j["auto_map"] = {{"AutoConfig", "modeling_pope.PopeConfig"},
                   {"AutoModelForCausalLM", "modeling_pope.PopeForCausalLM"}};
  j["vocab_size"] = m.vocab_size;
  j["padded_vocab_size"] = m.padded_vocab_size;
  j["hidden_size"] = m.n_embd;
  j["num_hidden_layers"] = m.n_layer;
  j["num_attention_heads"] = m.n_head;
  j["head_dim"] = m.head_dim();
  j["intermediate_size"] = 4 * m.n_embd;
  j["hidden_act"] = "gelu_pytorch_tanh";
  j["rms_norm_eps"] = m.norm_eps;
  // The windows the checkpoint was trained on; L_train of the encodings is context_length
  // (they differ after a long-context fine-tune). Positions are computed: longer inputs work.
  j["max_position_embeddings"] = config.train.seq_len;
  j["context_length"] = m.context_length;
  j["position_encoding"] = m.position.kind;
  j["tie_word_embeddings"] = true;
  j["use_cache"] = false;
  j["torch_dtype"] = torch_dtype_name(options.dtype);
  if (gpt2_vocabulary) {
    j["bos_token_id"] = kGpt2EndOfText;
    j["eos_token_id"] = kGpt2EndOfText;
  }
  j["pope_export"] = {{"format_version", kFormatVersion},
                      {"checkpoint", fs::absolute(checkpoint.step_dir).lexically_normal().string()},
                      {"step", state.step},
                      {"config_hash", state.config_hash},
                      {"overrides", options.overrides},
                      {"dtype", short_dtype_name(options.dtype)}};
  j["pope_config"] = config_to_json(config);
  return j;
}

nlohmann::ordered_json tokenizer_config(int model_max_length) {
  return {{"tokenizer_class", "GPT2Tokenizer"},
          {"model_max_length", model_max_length},
          {"bos_token", kEndOfText},
          {"eos_token", kEndOfText},
          {"unk_token", kEndOfText},
          {"add_prefix_space", false},
          {"add_bos_token", false},
          {"errors", "replace"},
          {"clean_up_tokenization_spaces", false}};
}

nlohmann::ordered_json special_tokens_map() {
  return {{"bos_token", kEndOfText}, {"eos_token", kEndOfText}, {"unk_token", kEndOfText}};
}

std::string folder_readme(const EvalCheckpoint& checkpoint, const HfExportOptions& options, std::int64_t parameters,
                          bool with_tokenizer, bool gpt2_vocabulary, const std::string& folder_name) {
  const RunConfig& config = checkpoint.config;
  const ModelConfig& m = config.model;
  std::string text = fmt::format(
      "# pope model: {}, step {}\n\n"
      "Exported by `pope-export --format hf --dtype {}` from `{}`: a decoder-only GPT with {} layers, width {}, {} "
      "heads, the positional encoding `{}`, a vocabulary of {} tokens (embedding padded to {} rows; the logits "
      "of the padded rows are left out), {} parameters. Trained on windows of {} tokens (L_train = "
      "`model.context_length` = {}); positions are computed, so it evaluates at any length.\n\n",
      describe_position(m.position), checkpoint.step, short_dtype_name(options.dtype),
      checkpoint.step_dir.string(), m.n_layer, m.n_embd, m.n_head, m.position.kind, m.vocab_size,
      m.padded_vocab_size, parameters, config.train.seq_len, m.context_length);
  text += "## Files\n\n";
  text += fmt::format(
      "- `model.safetensors`: the weights under pope's parameter names, {}.\n"
      "- `config.json`: the sizes in Hugging Face's names, `auto_map`, and pope's whole resolved run config under "
      "`pope_config` (the model reads `pope_config.model`).\n"
      "- `modeling_pope.py`: the model in PyTorch, every encoding of pope; imports only torch (safetensors and "
      "transformers when installed).\n",
      options.dtype == ExportDtype::bf16 ? "bf16, with the positional parameters (`layers.*.position.*`) in f32"
                                         : "f32");
  if (with_tokenizer)
    text += "- `vocab.json`, `merges.txt`, `tokenizer_config.json`, `special_tokens_map.json`: the GPT-2 BPE "
            "tokenizer (`<|endoftext|>` = 50256).\n";
  else if (gpt2_vocabulary)
    text += "- No tokenizer files (exported with `--no-tokenizer`); the ids are GPT-2's.\n";
  else
    text += fmt::format("- No tokenizer files: the model's {}-token vocabulary is not GPT-2's; feed it the ids it "
                        "was trained on.\n",
                        m.vocab_size);
  text += fmt::format(
      "\n## PyTorch alone\n\n"
      "```python\n"
      "import sys, torch\n"
      "sys.path.insert(0, \"path/to/{0}\")            # this folder\n"
      "import modeling_pope\n"
      "model = modeling_pope.PopeGPT.from_pretrained(\"path/to/{0}\")   # float32 on the CPU; dtype=, device=\n"
      "tokens = torch.tensor([[{1}]])\n"
      "logits = model(tokens)                           # [1, T, {2}]\n"
      "nll = model.token_nll(tokens[:, :-1], tokens[:, 1:])   # per-token NLL; targets < 0 are masked\n"
      "```\n\n"
      "torch 1.13 or 2.x; the `safetensors` package is used when installed, else a reader built into the file.\n\n",
      folder_name, gpt2_vocabulary ? "464, 2068, 7586, 21831" : "1, 2, 3, 4", m.vocab_size);
  text += fmt::format(
      "## transformers\n\n"
      "```python\n"
      "import torch\n"
      "from transformers import AutoModelForCausalLM{1}\n"
      "model = AutoModelForCausalLM.from_pretrained(\"path/to/{0}\", trust_remote_code=True)\n"
      "{2}"
      "out = model(ids, labels=ids)                     # out.logits, out.loss (labels shifted inside, -100 ignored)\n"
      "```\n\n",
      folder_name, with_tokenizer ? ", GPT2TokenizerFast" : "",
      with_tokenizer ? fmt::format("tokenizer = GPT2TokenizerFast.from_pretrained(\"path/to/{}\")\n"
                                   "ids = tokenizer(\"The quick brown fox\", return_tensors=\"pt\").input_ids\n",
                                   folder_name)
                     : "ids = torch.tensor([[1, 2, 3, 4]])\n");
  text +=
      "## Limits\n\n"
      "Every forward computes the whole sequence (no KV cache; `generate()` is not supported), no padding (an "
      "`attention_mask` must be all ones), no dropout. The model matches pope's own per-token log-likelihoods "
      "(pope's docs/export.md gives the tolerances measured).\n";
  return text;
}

void check_stop(const HfExportOptions& options, const fs::path& out) {
  if (options.stop_requested && options.stop_requested())
    throw ExportInterrupted(fmt::format("stopped before the export was complete; {} was not written", out));
}

}  // namespace

void check_export_destination(const fs::path& requested) {
  const fs::path out = absolute_destination(requested);
  std::error_code error;
  const fs::file_status link = fs::symlink_status(out, error);
  if (fs::is_symlink(link))
    throw ConfigError("--out", fmt::format("{} is a symbolic link; name the folder itself", requested));
  if (fs::exists(link)) {
    if (!fs::is_directory(link))
      throw ConfigError("--out", fmt::format("{} exists and is not a directory; pope-export writes a new folder",
                                             requested));
    if (!fs::is_empty(out, error) || error)
      throw ConfigError("--out", fmt::format("{} is not empty; pope-export writes a new folder and never mixes its "
                                             "files into an existing one: remove it or name another",
                                             requested));
  }
  const fs::path parent = out.parent_path();
  if (!fs::is_directory(parent, error))
    throw ConfigError("--out", fmt::format("the directory {} of {} does not exist", parent, requested));
  if (::access(parent.c_str(), W_OK | X_OK) != 0)
    throw ConfigError("--out", fmt::format("cannot write in the directory {} of {}: {}", parent, requested,
                                           std::strerror(errno)));
}

HfExportResult export_hf(const HfExportOptions& options) {
  check_export_destination(options.out);
  const fs::path out = absolute_destination(options.out);

  // The checkpoint, as pope-eval opens it (model.* overrides only), and its weights.
  for (const std::string& assignment : options.overrides)
    if (assignment.rfind("model.", 0) != 0)
      throw ConfigError(assignment.substr(0, assignment.find('=')),
                        fmt::format("--set '{}': pope-export takes only model.* keys (the other sections describe "
                                    "training and do not change the exported model)",
                                    assignment));
  const EvalCheckpoint checkpoint = open_eval_checkpoint(options.checkpoint, options.overrides);
  const TrainerState state = read_trainer_state(checkpoint.step_dir);
  const ModelConfig& model = checkpoint.config.model;
  const ParameterLayout layout = build_parameter_layout(model, *make_position_encoding(model));
  const CheckpointData data = load_checkpoint(checkpoint.step_dir, layout, /*weights_only=*/true);

  // The tokenizer: GPT-2's files, verified (pinned sha256, merges agreeing with the ids).
  const bool gpt2_vocabulary = model.vocab_size == kGpt2VocabSize;
  fs::path tokenizer_dir;
  if (options.tokenizer == ExportTokenizer::required && !gpt2_vocabulary)
    throw ConfigError("--tokenizer", fmt::format("the model has a vocabulary of {} tokens, not GPT-2's {}; the GPT-2 "
                                                 "tokenizer files would not fit it",
                                                 model.vocab_size, kGpt2VocabSize));
  const bool with_tokenizer = options.tokenizer == ExportTokenizer::required ||
                              (options.tokenizer == ExportTokenizer::automatic && gpt2_vocabulary);
  if (with_tokenizer) {
    try {
      tokenizer_dir = find_tokenizer_dir(options.tokenizer_dir);
      load_gpt2_vocabulary(tokenizer_dir);
    } catch (const TokenizerError& error) {
      if (options.tokenizer == ExportTokenizer::required) throw;
      throw ConfigError("--tokenizer", fmt::format("the model has GPT-2's vocabulary, but no usable tokenizer files "
                                                   "were found ({}); give --tokenizer DIR (encoder.json, vocab.bpe) "
                                                   "or --no-tokenizer",
                                                   error.what()));
    }
  }

  const std::int64_t parameters = count_parameters(model, layout);
  std::vector<OutputFile> files;
  {
    OutputFile weights{"model.safetensors", {}, weight_tensors(layout, data.params, options.dtype), {}};
    // transformers loads only safetensors files whose metadata says format "pt".
    weights.metadata = {{"format", "pt"},
                        {"pope_step", std::to_string(state.step)},
                        {"pope_position", model.position.kind}};
    files.push_back(std::move(weights));
  }
  files.push_back({"config.json", hf_config(checkpoint, state, options, gpt2_vocabulary).dump(2) + "\n", {}, {}});
  files.push_back({"modeling_pope.py", std::string(embedded_modeling_file()), {}, {}});
  if (!tokenizer_dir.empty()) {
    files.push_back({"vocab.json", read_file(tokenizer_dir / "encoder.json"), {}, {}});
    files.push_back({"merges.txt", read_file(tokenizer_dir / "vocab.bpe"), {}, {}});
    files.push_back(
        {"tokenizer_config.json", tokenizer_config(checkpoint.config.train.seq_len).dump(2) + "\n", {}, {}});
    files.push_back({"special_tokens_map.json", special_tokens_map().dump(2) + "\n", {}, {}});
  }
  files.push_back({"README.md",
                   folder_readme(checkpoint, options, parameters, !tokenizer_dir.empty(), gpt2_vocabulary,
                                 out.filename().string()),
                   {}, {}});

  check_stop(options, out);
  remove_stale_staging(out);
  StagingDirectory staging(out);
  HfExportResult result;
  for (const OutputFile& file : files) {
    check_stop(options, out);
    const fs::path path = staging.path() / file.name;
    try {
      if (file.name == "model.safetensors") write_safetensors(path, file.tensors, file.metadata);
      else write_file_atomic(path, file.text);
    } catch (const CheckpointError& error) {
      throw ExportError(fmt::format("cannot write {} of {}: {}", file.name, out, error.what()));
    }
    result.files.push_back(file.name);
  }
  check_stop(options, out);
  check_export_destination(options.out);  // still absent or empty
  staging.commit();

  result.out = out;
  result.step_dir = checkpoint.step_dir;
  result.step = state.step;
  result.position = model.position.kind;
  result.parameters = parameters;
  result.tokenizer_dir = tokenizer_dir;
  return result;
}

}  // namespace pope
