// What the tools print besides their results: log lines (progress, warnings, errors) go to
// stderr, so that a tool's stdout holds only its results and an error is never lost in a pipe;
// results that cannot reach stdout (a full disk, /dev/full) fail the tool.
#pragma once

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

namespace pope::tools {

// Run at exit (as coreutils' close_stdout): stdout is buffered, so a full disk often fails only
// this last flush, after main returned 0; the tool then exits 1 naming the error instead.
inline void fail_if_stdout_lost() {
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  const int error = errno;
  std::cout.flush();  // empty unless a stream buffer of its own holds output
  if (flushed && std::cout && !std::ferror(stdout)) return;
  spdlog::error("cannot write the results to standard output: {}",
                !flushed && error != 0 ? std::strerror(error) : "an earlier write failed");
  std::_Exit(1);
}

inline void log_to_stderr(const std::string& tool) {
  auto logger = spdlog::stderr_color_mt(tool);
  logger->set_pattern("[%Y-%m-%d %H:%M:%S] %^%l%$ %v");  // as pope-train's run log
  spdlog::set_default_logger(logger);
  std::atexit(fail_if_stdout_lost);  // after spdlog's registry exists, so it runs before it is destroyed
}

// The message for std::bad_alloc, which says nothing by itself: a config (or a flag) asked for
// more host memory than this machine has.
inline const char* const kOutOfMemory =
    "out of host memory: the model, batch or data this run asks for do not fit in this machine's memory (check "
    "model.n_layer, model.n_embd, model.vocab_size, train.batch_size, train.micro_batch_size, train.seq_len and "
    "train.threads)";

}  // namespace pope::tools
