// --version (the build's identity) and the help's plain type names, shared by every tool.
#include "tools/version.hpp"

#include <fmt/format.h>

#include "pope_build_info.hpp"

#if POPE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif
#if POPE_HAVE_CUDNN
#include <cudnn_version.h>
#endif
#if POPE_HAVE_NCCL
#include <nccl.h>
#endif

namespace pope::tools {

namespace {

// The versions of the CUDA libraries whose headers this build compiled against.
std::string cuda_runtime_version() {
#if POPE_HAVE_CUDA
  return fmt::format("{}.{} (nvcc {})", CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10, POPE_BUILD_CUDA_COMPILER);
#else
  return "not built";
#endif
}

std::string cudnn_version() {
#if POPE_HAVE_CUDNN
  return fmt::format("{}.{}.{}", CUDNN_MAJOR, CUDNN_MINOR, CUDNN_PATCHLEVEL);
#else
  return "not built";
#endif
}

std::string nccl_version() {
#if POPE_HAVE_NCCL
  return fmt::format("{}.{}.{}", NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
#else
  return "not built";
#endif
}

// What a validator's description says about the value, if anything: the choices of a set
// ("{a,b}") or a kind of path (FILE, DIR, PATH); bounds ("POSITIVE") name the check instead.
std::string value_name_in(const std::string& description) {
  if (description.starts_with('{')) return description;
  for (const char* name : {"FILE", "DIR", "PATH"})
    if (description.starts_with(name)) return name;
  return {};
}

void show_plain_type_names(CLI::App& app) {
  for (CLI::Option* option : app.get_options()) {
    std::string value_name;
    for (int index = 0;; ++index) {
      CLI::Validator* validator = nullptr;
      try {
        validator = option->get_validator(index);
      } catch (const CLI::OptionNotFound&) {
        break;
      }
      if (const std::string name = value_name_in(validator->get_description()); !name.empty()) value_name = name;
      validator->description("");
    }
    if (!value_name.empty()) option->type_name(value_name);
  }
  for (CLI::App* subcommand : app.get_subcommands([](CLI::App*) { return true; })) show_plain_type_names(*subcommand);
}

}  // namespace

std::string version_text(const std::string& tool) {
  const std::string commit = std::string(POPE_BUILD_COMMIT) + (POPE_BUILD_DIRTY ? " (dirty: uncommitted changes)" : "");
  return fmt::format("{} {}\n"
                     "commit:       {}\n"
                     "build type:   {}\n"
                     "compiler:     {}\n"
                     "CUDA runtime: {}\n"
                     "cuDNN:        {}\n"
                     "NCCL:         {}",
                     tool, POPE_BUILD_VERSION, commit, POPE_BUILD_TYPE, POPE_BUILD_CXX_COMPILER,
                     cuda_runtime_version(), cudnn_version(), nccl_version());
}

void finish_cli(CLI::App& app, const std::string& tool) {
  app.set_version_flag("--version", [tool] { return version_text(tool); }, "print the version, commit and build of "
                                                                          "this program, then exit");
  show_plain_type_names(app);
}

}  // namespace pope::tools
