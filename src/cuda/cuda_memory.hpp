// Device memory in use, for benchmarks (host side).
#pragma once

#include <cstddef>

namespace pope {

// Bytes in use on the calling thread's current CUDA device: total − free as cudaMemGetInfo
// reports them (the CUDA context and other processes' memory included). Throws
// std::runtime_error when the query fails.
std::size_t cuda_memory_in_use();

}  // namespace pope
