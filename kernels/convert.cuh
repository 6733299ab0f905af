// Conversion between the floating-point dtypes on the device (Backend::convert).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace pope::kernels {

enum class FloatKind { f32, f64, bf16 };

// dst[i] = src[i] for i < count, each element through double (exact for f32 and bf16);
// bf16 results are rounded to nearest even from f32, as the CPU backend does.
cudaError_t convert(void* dst, FloatKind dst_kind, const void* src, FloatKind src_kind, std::size_t count,
                    cudaStream_t stream);

}  // namespace pope::kernels
