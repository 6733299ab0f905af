// Launch geometry shared by the kernels' host-side launchers.
#pragma once

#include <cstddef>

namespace pope::kernels {

// Blocks for a grid-stride loop over `count` items: enough to cover them once, capped so
// that huge tensors reuse threads instead of launching millions of tiny blocks.
inline unsigned grid_stride_blocks(std::size_t count, int threads_per_block) {
  constexpr std::size_t kMaxBlocks = 8192;  // ≈ 60 blocks per SM on an H200: enough to fill it
  const std::size_t needed = (count + threads_per_block - 1) / threads_per_block;
  return static_cast<unsigned>(needed < 1 ? 1 : (needed < kMaxBlocks ? needed : kMaxBlocks));
}

// True when `pointer` may be read and written as 16-byte vectors.
inline bool aligned16(const void* pointer) { return reinterpret_cast<std::size_t>(pointer) % 16 == 0; }

}  // namespace pope::kernels
