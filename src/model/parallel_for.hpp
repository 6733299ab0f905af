// A parallel loop on the host whose result does not depend on how many threads run it, for
// the CPU backend's ops and for parameter initialisation.
#pragma once

#include <cstdint>
#include <exception>
#include <mutex>

namespace pope {

// body(i) for i in [0, n), statically scheduled on `threads` threads. An exception thrown
// by body (e.g. from a position-encoding hook) cannot cross the OpenMP region, so the
// first one is kept and rethrown after the loop.
template <class Body> void parallel_for(int threads, std::int64_t n, Body&& body) {
  std::exception_ptr first_error;
  std::once_flag error_once;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (std::int64_t i = 0; i < n; ++i) {
    try {
      body(i);
    } catch (...) {
      std::call_once(error_once, [&] { first_error = std::current_exception(); });
    }
  }
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace pope
