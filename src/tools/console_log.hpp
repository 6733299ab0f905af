// What the tools print besides their results: log lines (progress, warnings, errors) go to
// stderr, so that a tool's stdout holds only its results and an error is never lost in a pipe.
#pragma once

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <string>

namespace pope::tools {

inline void log_to_stderr(const std::string& tool) {
  auto logger = spdlog::stderr_color_mt(tool);
  logger->set_pattern("[%Y-%m-%d %H:%M:%S] %^%l%$ %v");  // as pope-train's run log
  spdlog::set_default_logger(logger);
}

// The message for std::bad_alloc, which says nothing by itself: a config (or a flag) asked for
// more host memory than this machine has.
inline const char* const kOutOfMemory =
    "out of host memory: the model, batch or data this run asks for do not fit in this machine's memory (check "
    "model.n_layer, model.n_embd, model.vocab_size, train.batch_size, train.micro_batch_size, train.seq_len and "
    "train.threads)";

}  // namespace pope::tools
