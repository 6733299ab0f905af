// Factory of the CPU reference backend (private to the library; make_backend() in
// backend.hpp is the public entry point).
#pragma once

#include <memory>
#include <string>

#include "pope/backend.hpp"

namespace pope {

// precision "float" or "double" picks the Real every op computes in; threads = 0 uses
// all OpenMP threads. Throws std::invalid_argument for any other precision or threads < 0.
std::unique_ptr<Backend> make_cpu_backend(const std::string& precision, int threads);

}  // namespace pope
