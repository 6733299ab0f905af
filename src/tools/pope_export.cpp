// pope-export: a checkpoint as a folder PyTorch loads without pope (pope/export.hpp,
// docs/export.md). This file parses flags, dispatches and maps errors to exit codes.
// Exit codes: 0 written, 1 checkpoint/tokenizer/write error, 2 usage or config error,
// 130/143 stopped by SIGINT/SIGTERM (nothing written).
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <fmt/std.h>
#include <spdlog/spdlog.h>

#include <csignal>
#include <iostream>

#include "pope/config.hpp"
#include "pope/export.hpp"
#include "tools/console_log.hpp"
#include "tools/version.hpp"

namespace {

constexpr int kExitRuntime = 1;
constexpr int kExitConfig = 2;

volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void handle_stop_signal(int signal_number) { g_stop_signal = signal_number; }

}  // namespace

int main(int argc, char** argv) {
  pope::tools::log_to_stderr("pope-export");
  CLI::App app{
      "pope-export: write a trained checkpoint as a folder that PyTorch loads without pope.\n"
      "--format hf writes model.safetensors (the weights under pope's names), config.json (Hugging Face's keys,\n"
      "auto_map, and pope's resolved run config under pope_config), modeling_pope.py (the model in PyTorch, every\n"
      "encoding; imports only torch, and safetensors/transformers when installed), README.md and, for a model with\n"
      "GPT-2's vocabulary, the GPT-2 tokenizer (vocab.json, merges.txt, tokenizer_config.json,\n"
      "special_tokens_map.json). Load it with modeling_pope.PopeGPT.from_pretrained(DIR), or with\n"
      "transformers.AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True).\n"
      "The folder appears whole or not at all: it is written into a hidden directory beside --out (every file\n"
      "fsync'd) and renamed into place at the end."};
  app.footer("Exit codes: 0 written, 1 checkpoint, tokenizer or write error, 2 usage or config error, 130/143 stopped\n"
             "by SIGINT/SIGTERM (nothing written).\n"
             "Example: pope-export --checkpoint runs/pope124m --format hf --out exports/pope124m --dtype bf16");
  std::string checkpoint, out, format = "hf", dtype = "f32", tokenizer_dir;
  std::vector<std::string> overrides;
  bool no_tokenizer = false;
  app.add_option("--checkpoint", checkpoint, "run directory (its newest checkpoint) or step directory "
                                             "(<run>/checkpoints/step_N); the model config is the run's config.json")
      ->required();
  app.add_option("--out", out, "the folder to create; it must not exist or be an empty directory, in an existing "
                               "directory")
      ->required();
  app.add_option("--format", format, "hf: a Hugging Face–style folder (the only format)")
      ->check(CLI::IsMember({"hf"}))
      ->default_val("hf");
  app.add_option("--dtype", dtype, "f32, or bf16 (rounded to nearest even; the positional parameters "
                                   "layers.*.position.* stay f32, as pope's CUDA backend reads them)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->default_val("f32");
  app.add_option("-s,--set", overrides, "override a model.* key of the checkpoint's config, as pope-eval --set, e.g. "
                                        "--set model.position.rope.scaling.kind=yarn (repeatable)");
  auto* tokenizer_flag = app.add_option("--tokenizer", tokenizer_dir,
                                        "directory of the GPT-2 tokenizer files encoder.json and vocab.bpe (checked "
                                        "against their pinned sha256); default $POPE_TOKENIZER_DIR, else data/tokenizer "
                                        "in or above the working directory, else PREFIX/share/pope/tokenizer of an "
                                        "installed binary, else data/tokenizer above the binary. Written only for a "
                                        "model with "
                                        "GPT-2's 50,257-token vocabulary; such a model needs them or --no-tokenizer");
  app.add_flag("--no-tokenizer", no_tokenizer, "write no tokenizer files")->excludes(tokenizer_flag);
  pope::tools::finish_cli(app, "pope-export");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : kExitConfig;
  }

  pope::HfExportOptions options;
  options.checkpoint = checkpoint;
  options.out = out;
  options.dtype = dtype == "bf16" ? pope::ExportDtype::bf16 : pope::ExportDtype::f32;
  options.overrides = overrides;
  options.tokenizer = no_tokenizer      ? pope::ExportTokenizer::none
                      : *tokenizer_flag ? pope::ExportTokenizer::required
                                        : pope::ExportTokenizer::automatic;
  options.tokenizer_dir = tokenizer_dir;
  options.stop_requested = [] { return g_stop_signal != 0; };
  std::signal(SIGINT, handle_stop_signal);
  std::signal(SIGTERM, handle_stop_signal);

  try {
    pope::check_export_destination(options.out);  // refused before the checkpoint is read
    const pope::HfExportResult result = pope::export_hf(options);
    fmt::print("wrote {} ({} format, {}): {} at step {} from {}, {} parameters; files: {}\n", result.out.string(),
               format, dtype, result.position, result.step, result.step_dir.string(), result.parameters,
               fmt::join(result.files, ", "));
    if (result.tokenizer_dir.empty()) fmt::print("no tokenizer files written\n");
    else fmt::print("tokenizer from {}\n", result.tokenizer_dir.string());
    std::cout.flush();
    return std::cout ? 0 : kExitRuntime;
  } catch (const pope::ConfigError& e) {
    spdlog::error("config error: {}", e.what());
    return kExitConfig;
  } catch (const pope::ExportInterrupted& e) {
    spdlog::error("{}", e.what());
    return 128 + int(g_stop_signal);
  } catch (const std::bad_alloc&) {
    spdlog::error("{}", pope::tools::kOutOfMemory);
    return kExitRuntime;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return kExitRuntime;
  }
}
